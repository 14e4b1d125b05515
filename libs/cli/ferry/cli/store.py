"""`ferry store verify [--repair]`: which checkpoints in the store would restore, and why not.

It reads the store directly (no cluster needed), so it runs where the store's credentials are:
the same URL and FERRY_S3_* variables as `ferry up --store`, or `--data-dir` for the default
local store of an all-in-one cluster. Exit code 1 when any kept checkpoint would not restore.
"""

import argparse
import os
from pathlib import Path

from ferry.cli.output import print_json, size, table

EPILOG = """examples:
  ferry store verify --data-dir /var/lib/ferry
  ferry store verify --store 's3://ckpts/ferry?endpoint=minio:9000' --repair -o json
"""


def add_store_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]",
                     common: argparse.ArgumentParser) -> None:
    help_ = "check the checkpoint store: which checkpoints restore (verify), and mend what can be mended"
    p = sub.add_parser("store", help=help_, description=help_, parents=[common], epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="store_cmd", metavar="ACTION", required=True)
    v = actions.add_parser("verify", parents=[common], help="read every manifest and chunk and check its hash; "
                           "say which checkpoints would restore")
    v.add_argument("--store", help="store URL (default: FERRY_STORE_URL, else DATA_DIR/store)")
    v.add_argument("--data-dir", help="an all-in-one cluster's data dir (default: FERRY_DATA_DIR or /var/lib/ferry)")
    v.add_argument("--key-file", help="the store's keyring (default: FERRY_STORE_KEY_FILE, else "
                   "DATA_DIR/secrets/store.keys)")
    v.add_argument("--repair", action="store_true", help="quarantine damaged chunks (the next checkpoint that "
                   "holds those bytes uploads them again) and delete chunks no checkpoint uses")


def store_url(args: argparse.Namespace) -> str:
    if args.store:
        return str(args.store)
    if os.environ.get("FERRY_STORE_URL") and not args.data_dir:
        return os.environ["FERRY_STORE_URL"]
    return os.path.join(args.data_dir or os.environ.get("FERRY_DATA_DIR", "/var/lib/ferry"), "store")


def key_file(args: argparse.Namespace) -> Path:
    """The store's keyring: --key-file, FERRY_STORE_KEY_FILE, else DATA_DIR/secrets/store.keys."""
    if getattr(args, "key_file", None):
        return Path(args.key_file)
    if os.environ.get("FERRY_STORE_KEY_FILE") and not args.data_dir:
        return Path(os.environ["FERRY_STORE_KEY_FILE"])
    return Path(args.data_dir or os.environ.get("FERRY_DATA_DIR", "/var/lib/ferry")) / "secrets" / "store.keys"


def cmd_store(args: argparse.Namespace) -> int:
    from ferry.cli.progress import OpProgress
    from ferry.common.errors import UsageError
    from ferry.store.url import open_store

    url = store_url(args)
    if "://" not in url and not os.path.isdir(url):
        raise UsageError(f"no store at {url}: give --store URL or --data-dir of a cluster")
    store = open_store(url, key_file(args))
    with OpProgress("verify") as bar:
        report = store.verify(repair=args.repair, progress=lambda done, total: bar.update("chunks", done, total))
    if args.output == "json":
        print_json({**report.model_dump(), "ok": report.ok, "store": url})
    else:
        table([[c.job, c.checkpoint, "yes" if c.restorable else "NO", c.problem or ""] for c in report.checkpoints],
              ["JOB", "CHECKPOINT", "RESTORES", "PROBLEM"])
        bad = sum(not c.restorable for c in report.checkpoints)
        print(f"{len(report.checkpoints)} checkpoint(s), {bad} would not restore; {report.chunks_checked} chunks "
              f"read ({size(report.bytes_read)}), {report.chunks_bad} bad"
              + (f"; repaired: {report.quarantined} quarantined, {report.orphans_deleted} unused deleted"
                 if args.repair else ""))
        if report.gc_error:
            print(f"gc did not run: {report.gc_error}")
    return 0 if report.ok else 1
