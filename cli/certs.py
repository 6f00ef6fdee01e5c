"""``edged certs ca|server|device|backend|revoke|crl|status|acl``: a small CA for the broker and the devices."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    certs = sub.add_parser(
        "certs",
        help="a small CA for the broker and the devices (TLS client certificates)",
        description="Make a CA, server and device certificates, revoke them, renew the CRL, and say what "
        "expires when (see systemd/mosquitto/ and docs/operator.md, Broker security).",
    )
    csub = certs.add_subparsers(dest="certs_verb", metavar="CERTS_VERB", required=True)
    c_ca = csub.add_parser("ca", help="make ca.crt, ca.key and an empty crl.pem in --dir")
    c_ca.set_defaults(func=_ca)
    c_srv = csub.add_parser(
        "server", help="a broker certificate for the given host names / addresses (key readable by group mosquitto)"
    )
    c_srv.add_argument("hosts", nargs="+", metavar="HOST")
    c_srv.set_defaults(func=_server)
    c_dev = csub.add_parser(
        "device", help="a device certificate; its CN (the device id) is its MQTT user name (not `backend`)"
    )
    c_dev.add_argument("device_id")
    c_dev.set_defaults(func=_device)
    c_back = csub.add_parser(
        "backend", help="the backend's certificate (CN backend: edged.acl's backend, for edged push / watch)"
    )
    c_back.set_defaults(func=_backend)
    c_rev = csub.add_parser("revoke", help="add a certificate to --dir/crl.pem")
    c_rev.add_argument("cert", type=Path)
    c_rev.set_defaults(func=_revoke)
    c_crl = csub.add_parser("crl", help="sign --dir/crl.pem again with a fresh next update (then SIGHUP mosquitto)")
    c_crl.add_argument("--days", type=int, default=365, help="its next update, in days (default 365)")
    c_crl.set_defaults(func=_crl)
    c_st = csub.add_parser(
        "status", help="the CA, CRL and certificates in --dir and when each ends; exit 1 if any ends within --warn-days"
    )
    c_st.add_argument("--warn-days", type=int, default=30, metavar="N", help="warn this many days ahead (default 30)")
    c_st.set_defaults(func=_status)
    c_acl = csub.add_parser(
        "acl", help="print mosquitto's ACL for a topic prefix (the shipped edged.acl is the default's)"
    )
    c_acl.add_argument("--prefix", default="edged", help="the devices' mqtt.topic_prefix (default edged)")
    c_acl.set_defaults(func=_acl)
    for c in (c_ca, c_srv, c_dev, c_back, c_rev, c_crl, c_st):
        c.add_argument("--dir", type=Path, required=True, help="the CA's folder")
    for c in (c_srv, c_dev, c_back):
        c.add_argument("--days", type=int, default=825, help="validity in days (default 825)")


def _ca(args: argparse.Namespace) -> int:
    from edged.deploy import certs

    out = certs.make_ca(args.dir)
    print(f"certs: wrote {args.dir / 'crl.pem'} (empty; mosquitto's crlfile)")
    print(f"certs: wrote {out}")
    return 0


def _server(args: argparse.Namespace) -> int:
    from edged.deploy import certs

    out = certs.make_cert(args.dir, "server", hosts=args.hosts, days=args.days)
    print(f"certs: {certs.share_with_broker(args.dir / 'server.key')}")
    print(f"certs: wrote {out}")
    return 0


def _device(args: argparse.Namespace) -> int:
    from edged.deploy import certs

    out = certs.make_device(args.dir, args.device_id, days=args.days)
    print(f"certs: wrote {out}")
    return 0


def _backend(args: argparse.Namespace) -> int:
    from edged.deploy import certs

    out = certs.make_backend(args.dir, days=args.days)
    print(f"certs: wrote {out}")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from edged.deploy import certs

    out = certs.revoke(args.dir, args.cert)
    print(f"certs: wrote {out}")
    return 0


def _crl(args: argparse.Namespace) -> int:
    from edged.deploy import certs

    out = certs.write_crl(args.dir, days=args.days)
    print(f"certs: wrote {out}")
    return 0


def _status(args: argparse.Namespace) -> int:
    import datetime as dt

    from edged.deploy import certs

    folder: Path = args.dir
    warn_days: int = args.warn_days
    now = dt.datetime.now(dt.timezone.utc)
    found = certs.status(folder)
    for e in found:
        print(e.line(now, warn_days))
    due = [e for e in found if e.needs_action(now, warn_days)]
    for e in due:
        fix = f"edged certs crl --dir {folder}" if e.what == "CRL" else "issue it again (docs/operator.md)"
        print(f"certs: {e.path} ({e.what}) ends within {warn_days} days or has ended: {fix}", file=sys.stderr)
    return 1 if due else 0


def _acl(args: argparse.Namespace) -> int:
    from edged.deploy import certs

    sys.stdout.write(certs.acl(args.prefix))
    return 0
