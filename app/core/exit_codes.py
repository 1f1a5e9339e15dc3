"""Every exit status of ``tfmp``, with what it means (schedulers and scripts branch on them)."""
from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1        # the user's own code raised, or their layer breaks under mixed precision
EXIT_USAGE = 2         # bad input: one `error:` line, nothing written
EXIT_DIVERGED = 3      # the loss went non-finite and loss scaling could not recover
EXIT_PEER_LOST = 4     # multi-worker: another worker stopped; restart them all to resume
EXIT_OUTPUT_FAULT = 5  # the outputs could not be written (disk full, read-only, quota)
EXIT_SIGINT = 130      # 128 + SIGINT: Ctrl-C; a checkpoint was saved (unless sent twice)
EXIT_SIGTERM = 143     # 128 + SIGTERM, what a shell reports for a job killed by `docker stop`
EXIT_SIGPIPE = 141     # 128 + SIGPIPE: stdout's reader left early (`tfmp notebooks | head -1`)

MEANINGS = {
    EXIT_OK: "completed",
    EXIT_FAILED: "your code raised, or a layer clashes with the mixed policy (check: blockers found)",
    EXIT_USAGE: "bad input; nothing was written",
    EXIT_DIVERGED: "training diverged (non-finite loss that loss scaling could not recover)",
    EXIT_PEER_LOST: "multi-worker training lost a worker; restart every worker to resume",
    EXIT_OUTPUT_FAULT: "the outputs could not be written; free space, then --resume",
    EXIT_SIGINT: "interrupted by Ctrl-C; a checkpoint was saved (twice: stopped at once, the "
                 "newest kept), --resume continues",
    EXIT_SIGTERM: "stopped by SIGTERM (docker stop); a checkpoint was saved (twice: stopped at "
                  "once, the newest kept), --resume continues",
    EXIT_SIGPIPE: "the program reading the output stopped reading (a pipe into head)",
}


def interrupted(signum) -> int:
    """The exit status of a run stopped by ``signum``."""
    return EXIT_SIGINT if signum == 2 else EXIT_SIGTERM
