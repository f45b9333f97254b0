"""What every field of the JSON session report means: one mapping per record kind (pure).

``harness.reports.report`` builds the records; this module says what each of their fields
holds, field name -> meaning. The reference page ``docs/reference/report.md`` is rendered from
these mappings (``harness.docs_reference.report_page``), and ``tests/test_report.py`` checks
them against a real session's report and against the keys the report code writes: a field
added to a record without a meaning here, or a meaning left for a field the report no longer
has, fails it.

The meanings are markdown (links relative to ``docs/reference/``). A field that only some
records have says when it is there.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

# the session: harness.reports.report.build (time: + with_floor under `harness run`)
REPORT_FIELDS: Dict[str, str] = {
    "format": "the report's format, `2`; a reader refuses a newer one, fields are only ever "
              "added within a format",
    "tool": "`torchdist-harness VERSION`, the harness that wrote it",
    "created": "when it was written: UTC, ISO 8601 to the second",
    "source": "what wrote it: `pytest` (the plugin; `harness run` is pytest underneath)",
    "argv": "pytest's arguments as it was invoked",
    "duration": "the session's seconds, from the plugin's start to the end of the session",
    "evidence": "the session's evidence folder (null when no case ran)",
    "interrupted": "`\"SIGTERM\"` or `\"SIGINT\"` when the session was stopped by a signal (its "
                   "cases then stop where they were), else null",
    "environment": "the fingerprint of the machine and image: torch (version, git hash, "
                   "backends), Python, kernel, the libuv store default and the "
                   "[recorded environment variables](#environment-variables); `ranks_torch`: "
                   "each distinct torch the ranks said they imported (`torch`, `torch_path`, "
                   "`python`), and `torch` is theirs where they agree",
    "summary": "`{\"total\", \"passed\", \"failed\", \"skipped\", \"error\", "
               "\"collect_errors\"}`: the cases counted by status, and the files that could "
               "not be loaded",
    "time": "`{\"duration\", \"inherent\", \"workers\", \"ratio\"}`: the session's duration, "
            "the sum of every run's own time from its start line to its end (the waits the "
            "scenarios ask for: timeouts, delays, deadlines), the number of xdist workers, and "
            "the duration over `inherent / workers`; `harness run` adds the floor no scheduler "
            "can beat here, `longest_case`, `cpu_s`, `cores`, `floor` (the longest case or the "
            "session's CPU seconds over the cores, the larger) and `over_floor` (the duration "
            "over it), and prints it as its last line",
    "collect_errors": "scenario files that could not be loaded, `{\"file\", \"message\"}` (the "
                      "located problem)",
    "cases": "one [case record](#case-fields) per scenario case that was collected and "
             "selected",
}

# a case: harness.reports.report.case_record, item_record and repeated_record, and the
# plugin's SessionRecorder (status, reason, failure, duration from pytest's reports)
CASE_FIELDS: Dict[str, str] = {
    "id": "the pytest node id, `scenarios/busy.yaml::busy_port_released`; `harness diff` "
          "matches cases by it",
    "file": "the scenario file, as the node id names it",
    "name": "the test's name (pytest's item name)",
    "scenario": "the scenario's `name:`",
    "case": "the case id of a file with `cases:` (null otherwise)",
    "test_id": "`name[case]`, or the name where the file has no `cases:`",
    "about": "the scenario's `about:`",
    "marks": "the scenario's `marks:`",
    "faults": "the kinds of its faults, in order",
    "random": "true when a fault of the case draws at random while it runs (packet loss, "
              "jitter): one run's timings are one draw",
    "backend": "the scenario's backend",
    "world_size": "the scenario's world size",
    "notes": "what each fault did, in words (`busy_port: port 26851 held (listening), "
             "released 1 s after the start line`)",
    "start": "how the run asked its ranks to start: `fork` or `fresh` (the scenario's "
             "`start:`, or `--harness-start`)",
    "started": "how the run's processes started: `fresh` and `fork` counts; `fresh_because` "
               "(label -> why it ran fresh where the run asked for fork); `servers` (host -> "
               "`warm`, forked from the session's zygote, or `fresh`) and "
               "`server_fresh_because` (host -> why not warm)",
    "harness_memory": "the harness's own resident memory when every rank was ready: "
                      "`supervisor_mb`, `servers_mb` (its fork servers), `ranks`, "
                      "`per_rank_mb`; `{}` when the case did not run",
    "admission": "how the run passed the admission gate before its start line "
                 "(harness.machine.admission): `waited` (s), `beside` (runs in flight then), "
                 "`alone`, `held_for` (the last reason it was held); null when the case did "
                 "not run",
    "admission_waited": "seconds all the case's runs waited at the admission gate (in "
                        "`duration`, in no run's own times)",
    "status": "`passed` | `failed` (ranks did not end as expected) | `skipped` | "
              "`error` (the harness itself failed: neither pass nor fail)",
    "reason": "the skip reason, the error's last line, or `ranks did not end as expected`",
    "failure": "the full failure text pytest shows (the mismatch table with the evidence path)",
    "mismatches": "`[{\"label\", \"field\", \"expected\", \"observed\", \"line\"}]`: `label` a "
                  "rank or `job`, `line` the line of the scenario file the expectation is "
                  "written on; a repeated case's also carry `run`, the run they come from "
                  "(null for a frequency bound)",
    "job": "the job's outcome: the most severe of its ranks' (hang > crash > timeout > error "
           "> ok; [outcomes](outcomes.md)); null when no rank ran",
    "expectation": "the expectation block used for this torch (null when skipped before "
                   "choosing one)",
    "torch_version": "the torch version the run's ranks said they imported (the first ready "
                     "one's; null when the case did not run)",
    "torch_seen": "what the run's processes said from inside about their torch, one "
                  "`{\"torch\", \"torch_path\", \"python\"}` per distinct answer (the report's "
                  "`environment.ranks_torch` gathers them)",
    "duration": "the test's time (setup + call + teardown: the run itself is in setup)",
    "wall": "the run's length from the start line to its end",
    "deadline": "the harness's deadline (s from the start line): a rank alive then is a hang",
    "timeout": "torch's timeout (the scenario's `timeout:`)",
    "evidence": "absolute path of the case's evidence directory",
    "port_owners": "who had a socket on the master port (`{\"pid\", \"status\", \"laddr\", "
                   "\"cmdline\"}`, psutil)",
    "rules": "nftables rules per host at the end of a run with network namespaces",
    "counters": "per host, the kernel's non-zero TCP counters at the end of a run with network "
                "namespaces (`TcpExt.ListenOverflows`, `TcpExt.TCPSynRetrans`, "
                "`Tcp.OutRsts`...: what happened on the wire; `expect.counters` can bound them)",
    "effects": "what each fault did, per target, with its evidence and times "
               "(harness.judge.effects): `{\"n\", \"kind\", \"optional\", \"what\", \"status\", "
               "\"summary\", \"targets\"}`, `status` `acted` | `no effect` | `not "
               "observable`",
    "store": "what the run's store held, asked over TCPStore's wire protocol (no torch "
             "import, 3 s per step) at the deadline before the kill, or when a rank first "
             "raised: `answered` (false: `error` says why, e.g. a listener that is no store), "
             "`num_keys`, `joined` (the `init/` count of clients that joined), `gloo` (rank -> "
             "the address its gloo published for the full mesh), `keys` (each key, a value "
             "shortened); `{}` when never asked",
    "stores": "the same, for each store torchrun's workers hosted themselves "
              "(`share_store: false`), asked at the same moments on the host of the worker "
              "that hosts it; `[]` otherwise",
    "ranks": "one [rank record](#rank-fields) per row: rank, launcher row, restart",
    "timeline": "what the HTML chart draws, a [timeline record](#timeline-fields); null when "
                "the case did not run",
    # a repeated case (--harness-repeat N, repeat:, a race case): harness.reports.report
    # .repeated_record; its ranks, timeline and evidence are run 1's
    "repeat": "a repeated case only (`--harness-repeat N`, `repeat:`): N, how often it ran; "
              "its `ranks`, `timeline` and `evidence` are run 1's",
    "runs": "a repeated case only: each run's `{\"job\", \"wall\", \"ranks\"}` (label -> "
            "outcome)",
    "walls": "a repeated case only: each run's wall",
    "job_outcomes": "a repeated case only: the job outcomes counted over the runs",
    "flaky": "a repeated case only: the ranks that varied where their expectation allows one "
             "outcome",
}

# a rank: harness.reports.report.rank_record (+ repeated_record's counts)
RANK_FIELDS: Dict[str, str] = {
    "label": "`\"0\"`, `\"1\"`, ...; `\"job2:0\"` for a second job's ranks; `agent:HOST`, "
             "`parent:HOST` for a launcher's rows, `1@1` for a worker's restart attempt 1 "
             "([launchers](../launchers.md)); `LABEL#2` for a killed process started again "
             "(`restart_after`)",
    "outcome": "`ok` | `error` (raised, not a timeout) | `timeout` (torch's own timeout "
               "fired) | `hang` (alive at the deadline, killed by the harness) | `crash` "
               "(died without a Python exception) | `absent` (never started: a fault kept it "
               "out); [outcomes](outcomes.md)",
    "phase": "where it ended: `start`, `import`, `init`, `workload step N`, `destroy`, `exit` "
             "([phases](workload.md#phases))",
    "duration": "seconds from the start line to its end (a hang: to the kill)",
    "exception": "the raised class's name (null when it raised nothing)",
    "exception_mro": "the raised class's MRO, qualified",
    "message": "the exception's message",
    "family": "the message's [family](../reports-and-cli.md#message-families)",
    "reason": "why this outcome, in words (`killed by SIGKILL (sent by the fault)`)",
    "cause": "the diagnosis (harness.judge.diagnose), one line; \"\" for a rank that ended ok",
    "cause_evidence": "the lines the cause rests on",
    "cause_rule": "the rule of `harness.judge.diagnose.RULES` that gave the cause; \"\" when it "
                  "is `unknown` or the rank ended ok (the diagnosis corpus in "
                  "`tests/data/diagnosis/` pins it)",
    "returncode": "the process's exit status (negative: the signal that ended it)",
    "host": "the scenario host it ran on (a network namespace; `local` without hosts)",
    "addr": "the address it ran at (its host's)",
    "pid": "its process id",
    "import_s": "how long `import torch` took (before the start line; a rank forked from a "
                "warm server imports nothing itself)",
    "cpu_wait": "seconds its threads waited for a CPU after the start line (runqueue wait, "
                "summed over its live threads; read at its end, or at the deadline for a rank "
                "still alive; `null` when neither was possible): what the load added to "
                "`duration`, at most; the diff allows it",
    "claims": "only where its process told torch another rank than its row's: the `rank` it "
              "passed to `init_process_group`, else the RANK it started with "
              "(`rank_collision`, a copied env file); tables and the HTML report show the row "
              "as `1 (claims rank 0)`",
    "restart_of": "only for a killed process started again (`kill_rank`'s `restart_after`): "
                  "the label of the row it restarts; the killed row keeps its own verdict but "
                  "no longer counts for the job's outcome",
    "role": "only for a launcher's rows ([launchers](../launchers.md)): `agent`, `parent` or "
            "`worker`",
    "attempt": "only for a launcher's rows: a worker's restart attempt",
    "node": "only for a launcher's rows: a worker's agent or parent",
    "restarts": "only for an agent's row: its restarts of its workers",
    "root_cause": "only for an agent's row: the rank its `ChildFailedError` names first",
    "traceback": "the Python traceback of a raising rank (left out when empty, as are the "
                 "fields below)",
    "stacks": "faulthandler dump of all threads, taken at the deadline (hung ranks)",
    "native_stacks": "the native stacks of a hung rank (where py-spy is installed and "
                     "permitted), as text rendered from `py-spy dump --native --json` in "
                     "py-spy's own layout; the threads themselves (id, name, state, frames) "
                     "are in the evidence's `observation.json` as `native_threads`",
    "stdout_tail": "the last 4000 bytes of its stdout",
    "stderr_tail": "the last 4000 bytes of its stderr, with torch's C++ log lines",
    "stderr_key": "torch's warning, error and errno lines of the whole stderr "
                  "(`harness.judge.stderrlines`: never a stack frame, each distinct line once "
                  "with `[x N]`, the first 60 and last 40), which the tail may have lost; the "
                  "diagnosis reads it before the tail",
    # a repeated case's ranks (harness.reports.report.repeated_record)
    "outcomes": "a repeated case only: its outcomes counted over the runs",
    "families": "a repeated case only: what it said, `Exception: message family` counted over "
                "the runs (\"\" for nothing raised)",
    "durations": "a repeated case only: its duration in each run",
}

# harness.reports.report.timeline
TIMELINE_FIELDS: Dict[str, str] = {
    "deadline": "the harness's deadline, seconds from the start line",
    "timeout": "torch's timeout",
    "wall": "the run's length from the start line to its end",
    "master_port": "the port the harness leased for the run",
    "store": "where the job's store really is (harness.core.jobstore): `{\"job\", \"kind\", "
             "\"host\", \"addr\", \"port\", \"source\", \"verified\", \"why\", \"status\"}`",
    "ranks": "one [row](#timeline-rank-fields) per rank",
    "steps": "every step a fault added, from its declaration in the plan and the run's step "
             "log ([step fields](#timeline-step-fields)); the chart draws a row per `target` "
             "that is not a rank (a rank's signals are marks on its own row)",
}

TIMELINE_RANK_FIELDS: Dict[str, str] = {
    "label": "the rank's label, as in its rank record",
    "host": "the scenario host it ran on",
    "released_at": "when it was released, seconds from the start line",
    "ended_at": "when it ended, seconds from the start line (as the supervisor saw it)",
    "killed_at_deadline": "true when the harness killed it at the deadline",
    "signals": "signals faults sent it, `{\"signal\", \"t\", \"why\"}` (`why`: the fault kind)",
    "events": "`{\"ev\", \"t\", \"phase\", \"step\", ...}`: `phase`, `ready`, `released`, "
              "`joined`, `result`; `t` is relative to the start line, so `start` and `import` "
              "are negative: ranks import torch before the clock starts",
}

TIMELINE_STEP_FIELDS: Dict[str, str] = {
    "id": "the step's id (`busy_port#1`)",
    "fault": "the fault it belongs to",
    "what": "what it does, in words",
    "target": "what it acts on: a rank, a host, a port holder",
    "when": "when it is done, as planned",
    "undo_when": "when it is undone, as planned",
    "on": "seconds from the start line it was done; null if it never was",
    "off": "seconds from the start line it was undone; null if it never was (it lasted to the "
           "end)",
    "info": "what the step recorded when done (a helper's pid)",
}

# every record kind, in the reference page's order: (its title, its mapping)
KINDS: List[Tuple[str, Dict[str, str]]] = [
    ("Report fields", REPORT_FIELDS),
    ("Case fields", CASE_FIELDS),
    ("Rank fields", RANK_FIELDS),
    ("Timeline fields", TIMELINE_FIELDS),
    ("Timeline rank fields", TIMELINE_RANK_FIELDS),
    ("Timeline step fields", TIMELINE_STEP_FIELDS),
]
