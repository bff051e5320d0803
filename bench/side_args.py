"""The command line shared by the scripts that set an A/B's sides beside noshim's
(op_profile_diff.py, sample_report.py): DIR [SIDE ...] [--top N]."""
import os
import sys


def parse(argv, prog, usage):
    """(DIR, [SIDE ...], N: --top's number, 15 without it) from ARGV; None once PROG has said on
    stderr what is wrong (USAGE: its usage line)."""
    argv, top = list(argv), 15
    if "--top" in argv:
        i = argv.index("--top")
        try:
            top = int(argv[i + 1])
        except (IndexError, ValueError):
            print(f"{prog}: --top takes a number", file=sys.stderr)
            return None
        del argv[i:i + 2]
    if not argv or not os.path.isdir(argv[0]):
        print(f"usage: {usage}", file=sys.stderr)
        return None
    return argv[0], argv[1:], top
