"""sessionctl: the operator CLI. Expected errors are one line on stderr and a non-zero exit."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from typing import TYPE_CHECKING, Any

from pipelines.config import MAX_PARTITIONS, SessionsConfig, check_setting
from pipelines.errors import SessionsError
from sessionctl import INTERRUPTED, await_arrow_readers, install, record
from sessionctl.checks import (
    PARTITIONS,
    SECONDS,
    LogFile,
    Parser,
    check_writable,
    checked,
    count,
    object_store_failure,
    unwritable_location,
    user_id,
    users_file,
)

# Each command imports what it runs, in its own function: `--help`, `savepoints` and the other commands that start no
# JVM never import pyspark (about a second of such a command's own time, `python -X importtime`).
if TYPE_CHECKING:
    from pipelines.job.run_summary import RunSummary
    from pipelines.job.sink import MicroBatchSink


# The exit code of a check that ran and answered "no" (`restore --dry-run`: not restorable; `forget --verify`: not
# clean): a script tells it from 0 (yes) and from 1 (the check itself failed, one line) without parsing the JSON.
NOT_SO = 3


def _answer_no(*, command: str, reason: str) -> int:
    """The one line on stderr for a check whose answer is no; the answer itself is already on stdout."""
    print(f"sessionctl {command}: {reason}", file=sys.stderr)
    return NOT_SO


def _print(obj: Any, one_line: bool = True) -> None:
    """One JSON line (for scripts, `--json`), or indented JSON for a person."""
    print(json.dumps(obj, default=str) if one_line else json.dumps(obj, default=str, indent=2))


def cmd_catch_up(config: SessionsConfig, args: argparse.Namespace) -> None:
    from pipelines.job.stream import catch_up

    _print(catch_up(config).to_dict())


def cmd_run(config: SessionsConfig, args: argparse.Namespace) -> None:
    from state_store.stream_control import run_stream

    if INTERRUPTED.is_set():  # Ctrl-C while that import ran: nothing was started, the one line and 130 (main)
        raise KeyboardInterrupt
    # The first Ctrl-C asks for an orderly stop (between batches, then the summary), at any moment, JVM start-up
    # included; a second one is the impatient kind (sessionctl). get_spark keeps that handler over pyspark's.
    stop = INTERRUPTED
    if signal.getsignal(signal.SIGINT) is not record:  # called as a library function, not the console script
        install()

    def progress(summary: RunSummary, sink: MicroBatchSink) -> None:
        print(f"batches={summary.batches} input_rows={summary.input_rows} "
              f"sessions_written={sink.sessions_written} quarantined={sink.quarantined}", flush=True)

    # A source that cannot be read is retried, not fatal: its one line (pipelines.job.stream's log) on stderr as well.
    source_errors = logging.StreamHandler(sys.stderr)
    source_errors.setFormatter(logging.Formatter("sessionctl run: %(message)s"))
    logging.getLogger("pipelines.job.stream").addHandler(source_errors)
    print("running; Ctrl-C or `sessionctl stop` stops cleanly", file=sys.stderr, flush=True)
    _print(run_stream(config, stop=stop, poll_seconds=args.poll_seconds, on_progress=progress).to_dict())


def cmd_accept_loss(config: SessionsConfig, args: argparse.Namespace) -> None:
    from state_store.kafka_loss import accept_loss

    result = accept_loss(config)
    if args.json:
        _print(result.to_dict())
    elif not result.accepted:
        print(f"nothing lost: every offset raw_events recorded for Kafka topic {result.topic} is still in the topic")
    else:
        for gap in result.accepted:
            print(f"accepted: {gap['what']}")
        print(f"recorded in raw_events commit {result.ingest_seq}: the quarantine table shows each gap "
              "(reason lost_in_source) once the stream has run; ingest goes on after them")


def cmd_stop(config: SessionsConfig, args: argparse.Namespace) -> None:
    from state_store.stream_control import stop_stream

    if args.native and not args.savepoint:
        raise SessionsError("--native is the savepoint's: `sessionctl stop --savepoint --native`")
    _print(stop_stream(config, savepoint=args.savepoint, timeout_s=args.timeout,
                       native_copy=args.native or None).to_dict(), args.json)


def cmd_status(config: SessionsConfig, args: argparse.Namespace) -> None:
    from state_store.status import status

    report = status(config, with_state=not args.no_state).to_dict()
    if args.json:
        _print(report)
    else:
        for key, value in report.items():
            print(f"{key:>22}: {value}")


def cmd_savepoint(config: SessionsConfig, args: argparse.Namespace) -> None:
    from state_store.lifecycle import take_savepoint

    _print(take_savepoint(config, trigger="manual", full=args.full, native_copy=args.native or None).to_dict(),
           args.json)


def cmd_savepoints(config: SessionsConfig, args: argparse.Namespace) -> None:
    if args.action == "diff":
        _savepoints_diff(config, args)
        return
    if args.action is not None or args.ids:
        raise SessionsError(f"unknown savepoints action {' '.join([args.action or '', *args.ids]).strip()!r}: "
                            "`sessionctl savepoints` lists them, `sessionctl savepoints diff A B` compares two")
    from state_store.savepoint.catalog import SavepointStore

    # Each entry as the catalog holds it (`error` null when none) and its `uri`: the listing's keys since the start.
    _print([saved.to_dict(catalog=True) for saved in SavepointStore.of(config).list()], args.json)


def _savepoints_diff(config: SessionsConfig, args: argparse.Namespace) -> None:
    if len(args.ids) != 2:
        raise SessionsError("savepoints diff takes two savepoints: `sessionctl savepoints diff A B` (ids or latest)")
    from pipelines.job.runtime import get_spark, spark_failures
    from state_store.history import diff_savepoints

    with spark_failures(config):
        diff = diff_savepoints(config, get_spark(config), args.ids[0], args.ids[1])
    if args.json:
        _print(diff.to_dict())
        return
    print(f"{diff.savepoint_a} (batch {diff.batch_a}) -> {diff.savepoint_b} (batch {diff.batch_b})")
    print(f"  users: {diff.users_a} -> {diff.users_b}: {diff.users_added} added, {diff.users_removed} removed, "
          f"{diff.users_changed} changed, {diff.users_unchanged} unchanged")
    print(f"  open sessions: {diff.open_sessions_a} -> {diff.open_sessions_b}")
    for kind, users in diff.sample.items():
        if users:
            print(f"  e.g. {kind}: {', '.join(users)}")


def cmd_restore(config: SessionsConfig, args: argparse.Namespace) -> int | None:
    if args.dry_run:  # nothing stopped, locked or written; no JVM
        from state_store.preflight import plan_restore

        plan = plan_restore(config, args.savepoint, partitions=args.partitions, migrate=args.migrate,
                            canonical=args.canonical)
        if args.json:
            _print(plan.to_dict())
        else:
            verdict = "restorable" if plan.restorable else "NOT restorable"
            print(f"savepoint {plan.savepoint_id} (batch {plan.batch_id}, {plan.rows} state rows): {verdict} with the "
                  f"current settings, from its {plan.method} form; expected about {plan.expected_seconds:g} s "
                  f"({plan.rate_source})")
            if plan.native_note:
                print(f"  its native copy would not be used: {plan.native_note}")
            for reason in plan.reasons:
                print(f"  refused: {reason}")
            for migration in plan.migrations:
                print(f"  migrates: {migration}")
        if not plan.restorable:
            first = plan.reasons[0] if plan.reasons else "refused"
            more = f" (and {len(plan.reasons) - 1} more reason(s))" if len(plan.reasons) > 1 else ""
            return _answer_no(command=args.command, reason=f"savepoint {plan.savepoint_id} is not restorable: "
                                                           f"{first}{more}")
        return None
    from state_store.lifecycle import restore

    _print(restore(config, args.savepoint, partitions=args.partitions, migrate=args.migrate, online=args.online,
                   timeout_s=args.timeout, canonical=args.canonical).to_dict())
    return None


def cmd_rescale(config: SessionsConfig, args: argparse.Namespace) -> None:
    from state_store.rescale import rescale

    _print(rescale(config, args.partitions, timeout_s=args.timeout).to_dict())


def cmd_compact(config: SessionsConfig, args: argparse.Namespace) -> None:
    from state_store.maintenance import compact

    overrides = {name: value for name, value in (("keep_savepoints", args.keep_last),
                                                 ("keep_daily_days", args.keep_daily_days)) if value is not None}
    _print(compact(config.with_(**overrides), dry_run=args.dry_run).to_dict())


def cmd_state(config: SessionsConfig, args: argparse.Namespace) -> None:
    from pipelines.job.runtime import get_spark, spark_failures
    from state_store.state import lookup_user, top_sessions

    if args.history and args.user is None:
        raise SessionsError("--history needs --user U: one user's open sessions at each retained savepoint")
    result: Any
    with spark_failures(config):
        spark = get_spark(config)
        if args.history:
            from state_store.history import user_history

            result = user_history(config, spark, args.user)
        elif args.user is not None:
            result = lookup_user(spark, config, args.user)
        else:
            result = top_sessions(spark, config, args.top)
    if args.json:
        _print(result)
    else:
        print(json.dumps(result, indent=2, default=str))


def _forget_users(args: argparse.Namespace) -> list[str]:
    """The users of `forget`: every --user, then the --users-file's, each once in the order given."""
    return list(dict.fromkeys([*(args.user or []), *(args.users_file or [])]))


def cmd_forget(config: SessionsConfig, args: argparse.Namespace) -> int | None:
    # A verify imports no erasure (its imports alone are a good part of a quick verify's second)
    from state_store.verification import verify, verify_many

    if args.requests:
        from state_store.erasure_requests import forget_requested

        done = forget_requested(config)
        _print(done.to_dict(), args.json)
        for name, why in done.refused.items():  # left for an operator; the others were erased
            print(f"sessionctl forget: request file {name}: {why}", file=sys.stderr)
        return None
    users = _forget_users(args)
    if args.verify and len(users) == 1:
        verification = verify(config, users[0], full=args.full)
        _print(verification.to_dict(), args.json)
        if not verification.clean:
            places = ", ".join(f"{place} ({n})" for place, n in verification.found.items() if n)
            if places:
                return _answer_no(command=args.command, reason=f"the user still appears in {places}")
            first, why = next(iter(verification.unreadable.items()))
            return _answer_no(command=args.command, reason=f"{len(verification.unreadable)} file(s) could not be read, "
                                                           f"so may still name the user: {first} ({why})")
        return None
    if args.verify:
        checked = verify_many(config, users, full=args.full)
        _print(checked.to_dict(), args.json)
        if not checked.clean:
            found = [n for n, answer in enumerate(checked.users, 1) if any(answer.found.values())]
            if found:
                places = ", ".join(f"{place} ({n})" for place, n in checked.found.items() if n)
                return _answer_no(command=args.command, reason=f"{len(found)} of {len(users)} users still appear "
                                  f"(number {', '.join(map(str, found[:20]))}{', ...' if len(found) > 20 else ''} "
                                  f"in the order given) in {places}")
            first, why = next(iter(checked.users[0].unreadable.items()))
            return _answer_no(command=args.command, reason=f"{len(checked.users[0].unreadable)} file(s) could not be "
                                                           f"read, so may still name the users: {first} ({why})")
        return None
    from state_store.erasure import forget

    _print(forget(config, users).to_dict(), args.json)
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="sessionctl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("catch-up", help="process everything in landing, then stop").set_defaults(fn=cmd_catch_up)
    run = sub.add_parser("run", help="process continuously until interrupted")
    run.add_argument("--poll-seconds", type=SECONDS, default=5.0)
    run.set_defaults(fn=cmd_run)
    st = sub.add_parser("status", help="provider, partitions, last batch, state keys and bytes, watermark")
    st.add_argument("--json", action="store_true")
    st.add_argument("--no-state", action="store_true", help="skip reading the state (no Spark)")
    st.set_defaults(fn=cmd_status)
    save = sub.add_parser("savepoint", help="savepoint at the last committed batch (the stream may keep running)")
    save.add_argument("--json", action="store_true")
    save.add_argument("--full", action="store_true", help="a full savepoint even where an incremental one (only the "
                      "users changed since the previous savepoint) would do")
    save.add_argument("--native", action="store_true", help="also keep the checkpoint's own files of the batch: a "
                      "restore to the same provider, partitions and operator is then a file copy (no Spark job)")
    save.set_defaults(fn=cmd_savepoint)
    stp = sub.add_parser("stop", help="stop the running stream (any process or host) after its current batch")
    stp.add_argument("--savepoint", action="store_true", help="take the savepoint of its last batch as part of the stop")
    stp.add_argument("--native", action="store_true", help="with --savepoint: keep its native copy too")
    stp.add_argument("--timeout", type=SECONDS, default=None, help="seconds to wait (default 2x SESSIONS_STOP_TIMEOUT_S)")
    stp.add_argument("--json", action="store_true")
    stp.set_defaults(fn=cmd_stop)
    al = sub.add_parser("accept-loss", help="accept Kafka messages lost before ingest (SourceDataLost): a quarantine "
                        "row per gap, ingest goes on after it")
    al.add_argument("--json", action="store_true")
    al.set_defaults(fn=cmd_accept_loss)
    sps = sub.add_parser("savepoints", help="the savepoint catalog, newest first; `savepoints diff A B`: what changed")
    sps.add_argument("action", nargs="?", choices=["diff"], help="diff A B: users and open sessions added, removed "
                     "and changed from savepoint A to B (ids or latest)")
    sps.add_argument("ids", nargs="*", help=argparse.SUPPRESS)
    sps.add_argument("--json", action="store_true")
    sps.set_defaults(fn=cmd_savepoints)
    rs = sub.add_parser("restore", help="put state, source position and outputs back to a savepoint")
    rs.add_argument("--savepoint", required=True, help="savepoint id or 'latest'")
    rs.add_argument("--partitions", type=PARTITIONS, default=None, help=f"state partitions, 1 to {MAX_PARTITIONS}")
    rs.add_argument("--migrate", action="store_true", help="accept a savepoint made with other gap/lateness settings")
    rs.add_argument("--canonical", action="store_true", help="load the savepoint's canonical rows even when its "
                    "native copy could be put back")
    rs.add_argument("--dry-run", action="store_true", help="say whether the current settings can restore it, what "
                    "would be migrated and how long it should take; nothing is stopped, locked or written. Exit 0: "
                    f"restorable; {NOT_SO}: not restorable (the answer still on stdout, the reason on stderr)")
    rs.add_argument("--online", action="store_true", help="a running stream (`sessionctl run`, any host) restores "
                    "the savepoint between two batches and goes on from it; the answer gives its downtime. Without "
                    "it a running stream is a refusal; with no stream running it restores here")
    rs.add_argument("--timeout", type=float, default=None, help="with --online: seconds to wait for a running "
                    "stream's answer (default: the stop timeout twice plus an hour)")
    rs.add_argument("--json", action="store_true", help="with --dry-run: the answer as JSON")
    rs.set_defaults(fn=cmd_restore)
    rc = sub.add_parser("rescale", help="change the state partitions: of the stopped job here, or a running stream's "
                        "(it rescales between two batches and goes on; the answer gives its downtime)")
    rc.add_argument("--partitions", type=PARTITIONS, required=True, help=f"1 to {MAX_PARTITIONS}")
    rc.add_argument("--timeout", type=float, default=None, help="seconds to wait for a running stream's answer "
                    "(default: the stop timeout twice plus an hour)")
    rc.set_defaults(fn=cmd_rescale)
    sv = sub.add_parser("state", help="open sessions as the state store holds them now (running or stopped job)")
    which = sv.add_mutually_exclusive_group(required=True)
    which.add_argument("--user", type=user_id, help="one user's open session(s)")
    which.add_argument("--top", type=count(1), help="the N largest open sessions (hot keys)")
    sv.add_argument("--history", action="store_true", help="with --user: the user's open sessions at each retained "
                    "savepoint, oldest first")
    sv.add_argument("--json", action="store_true")
    sv.set_defaults(fn=cmd_state)
    fg = sub.add_parser("forget", help="erase users everywhere: tables, live state, savepoints, older table versions "
                        "(within SESSIONS_ERASURE_DEADLINE_HOURS), the tables' Delta logs, every landed file; later events of the "
                        "users are dropped at ingest. Many users in one forget cost about what one costs")
    whom = fg.add_argument_group("users (--user and --users-file, both may be given; or --requests)")
    whom.add_argument("--user", action="append", type=user_id, help="a user id to erase (repeatable)")
    whom.add_argument("--users-file", type=users_file, metavar="PATH", help="a file of user ids to erase, one per "
                      "line (surrounding whitespace and blank lines ignored)")
    whom.add_argument("--requests", action="store_true", help="the users of every pending erasure request (files "
                      "named *.users at SESSIONS_ERASURE_REQUESTS_URI), erased in one forget; the request files are "
                      "deleted once it is done")
    fg.add_argument("--verify", action="store_true", help="only say where the users still appear, per user. Exit 0: "
                    f"clean; {NOT_SO}: still found somewhere (the answer still on stdout, the places on stderr)")
    fg.add_argument("--full", action="store_true", help="with --verify: read every file and ask the live state, as "
                    "an auditor does, instead of skipping what the audit's index says cannot name the users")
    fg.add_argument("--json", action="store_true")

    def some_user(args: argparse.Namespace) -> None:
        if args.requests and (args.user or args.users_file or args.verify):
            fg.error("--requests takes the users from the request files: not with --user, --users-file or --verify")
        if args.full and not args.verify:
            fg.error("--full goes with --verify (an erasure always goes through every file)")
        if not (args.user or args.users_file or args.requests):
            fg.error("the following arguments are required: --user, --users-file or --requests")
    fg.set_defaults(fn=cmd_forget, after_parse=some_user)
    cp = sub.add_parser("compact", help="compaction and retention")
    # Within the bounds of the settings they override (pipelines.config).
    cp.add_argument("--keep-last", type=checked(lambda text: check_setting("keep_savepoints", text, "n")),
                    default=None, help="savepoints kept (default SESSIONS_KEEP_SAVEPOINTS, 5)")
    cp.add_argument("--keep-daily-days", type=checked(lambda text: check_setting("keep_daily_days", text, "n")),
                    default=None, help="plus the newest of each of these days (default SESSIONS_KEEP_DAILY_DAYS, 7)")
    cp.add_argument("--dry-run", action="store_true")
    cp.set_defaults(fn=cmd_compact)
    return parser


def _logs_to_file(config: SessionsConfig) -> None:
    """Library log records go to $SESSIONS_HOME/logs/errors.log, not the terminal: py4j logs a call interrupted by
    Ctrl-C with its traceback (on the root logger), and the terminal gets sessionctl's one line."""
    try:
        config.log_dir.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = LogFile(config.log_dir / "errors.log")
    except OSError:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(handlers=[handler], level=logging.WARNING, force=True)


READ_ONLY_COMMANDS = ("status", "savepoints", "state")  # plus restore --dry-run and forget --verify (_writes)


def _spark_ahead(config: SessionsConfig, args: argparse.Namespace) -> None:
    """For a command that will start a Spark session here once its imports and checks are done, the JVM launched
    now, beside them (about a second of a command, pipelines.job.runtime.start_jvm). `state` always; the others only
    where no stream holds the job: beside one they hand their work to it, are refused, or first give way to it at a
    lower CPU priority, which their JVM must inherit. A restore only where its savepoint is likely canonical (a
    native one starts no JVM)."""
    command = args.command
    if command != "state" and not (
            command in ("catch-up", "run", "savepoint", "rescale")
            or (command == "restore" and not args.dry_run and (args.canonical or not config.savepoint_native))
            or (command == "forget" and not args.verify and not args.requests)):
        return
    if command != "state":
        from pipelines.coordination.job_leases import running_stream

        if running_stream(config) is not None:
            return
    from pipelines.job.runtime import start_jvm

    start_jvm(config)


def _writes(args: argparse.Namespace) -> bool:
    """Whether the command writes to the data locations (checked writable before it starts; the others run on a
    read-only home)."""
    if args.command in READ_ONLY_COMMANDS:
        return False
    return not (args.command == "restore" and args.dry_run) and not (args.command == "forget" and args.verify)


def _label(args: argparse.Namespace) -> str:
    """The command as a message names it: `forget --verify`, `restore --dry-run`, or the command."""
    for flag in ("verify", "dry_run"):
        if getattr(args, flag, False):
            return f"{args.command} --{flag.replace('_', '-')}"
    return args.command


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "after_parse", None):  # what argparse cannot say itself (forget: --user or --users-file)
        args.after_parse(args)
    if args.command != "run":  # only `run` stops in order on Ctrl-C; the others end at once, in one line
        signal.signal(signal.SIGINT, signal.default_int_handler)
    config: SessionsConfig | None = None
    try:
        if INTERRUPTED.is_set():  # Ctrl-C while Python was still importing: nothing was started
            raise KeyboardInterrupt
        config = SessionsConfig.from_env()
        if _writes(args):
            check_writable(config, command=_label(args))
        _logs_to_file(config)
        _spark_ahead(config, args)
        code = args.fn(config, args) or 0  # a check's "no" (NOT_SO) is its answer, not an error
    except SessionsError as error:  # the one place an expected error (ConfigError too) becomes one line
        print(f"sessionctl {args.command}: {error}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        print(f"sessionctl {args.command}: interrupted", file=sys.stderr)
        code = 130
    except Exception as error:
        translated = None if config is None else \
            unwritable_location(config, error, command=_label(args)) or object_store_failure(config, error)
        if translated is None:
            raise  # not an expected error: its traceback
        logging.getLogger("sessionctl").warning("%s", translated, exc_info=error)  # the details, to errors.log
        print(f"sessionctl {args.command}: {translated}", file=sys.stderr)
        code = 1
    finally:
        # Orderly: the queries, the state stores, then the JVM, before Python exits (a JVM left to die with the
        # process can crash in RocksDB's native code on the way out). Ctrl-C here is ignored: we are leaving anyway.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if "pipelines.job.runtime" in sys.modules:  # only a command that imported it can have started Spark
            from pipelines.job.runtime import stop_spark

            stop_spark()
    # Then Arrow's threads, before the interpreter's teardown (not after an unexpected error: its traceback, whose
    # frames may hold a dataset, is printed at once).
    await_arrow_readers()
    return code


if __name__ == "__main__":
    sys.exit(main())
