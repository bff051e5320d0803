"""The self-tests' checker, shared by the benchmark's scripts (bench.py, report.py,
layer_steps.py): one ok/FAIL line per check, the detail shown only for a failure."""


class Checks:
    def __init__(self, script):
        self.script, self.fails = script, []

    def __call__(self, name, cond, detail=""):
        shown = f": {detail}" if detail and not cond else ""
        print(f"{'ok  ' if cond else 'FAIL'} {name}{shown}")
        if not cond:
            self.fails.append(name)

    def done(self):
        """Print the verdict; the exit status (0: every check passed)."""
        print(f"{self.script} selftest: "
              f"{'PASS' if not self.fails else 'FAIL: ' + ', '.join(self.fails)}")
        return 1 if self.fails else 0
