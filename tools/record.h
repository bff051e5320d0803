/* flexshim-profile record (tools/record.c). */
#ifndef FS_TOOL_RECORD_H
#define FS_TOOL_RECORD_H

#include <stdio.h>

int fs_tool_record(int argc, char **argv);
void fs_tool_record_help(FILE *out);

#endif
