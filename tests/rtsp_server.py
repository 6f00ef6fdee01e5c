"""A real RTSP camera for the tests: Debian's gst-rtsp-server through PyGObject, in its own process.

    python rtsp_server.py PORT VIDEO [--protocols tcp|udp|both] [--user U --password P] [--h264 | --h265]
                                     [--tls-cert CERT --tls-key KEY]

Serves VIDEO (decoded and encoded to H.264 by openh264enc, as an IP camera sends it) at
rtsp://127.0.0.1:PORT/cam, at the file's own rate (--h264: VIDEO is an MP4 with H.264 already, sent as it
is; --h265: VIDEO is an MP4 with H.265, sent as it is by rtph265pay). Each client gets its own pipeline: a
shared media aborted gst-rtsp-server 1.22 (an assertion in gst_rtsp_media_get_rates) when several clients
joined at once. Prints "ready" once it listens. --user/--password:
Basic authentication (a client without them, or with others, gets 401). --tls-cert/--tls-key: RTSP over
TLS (rtsps://, gst-rtsp-server's set_tls_certificate), media interleaved in that connection. SIGSTOP makes
it a hung camera.
"""

from __future__ import annotations

import argparse
import sys
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", ImportWarning)
    import gi  # type: ignore[import-untyped,import-not-found,unused-ignore]

    gi.require_version("Gio", "2.0")
    gi.require_version("Gst", "1.0")
    gi.require_version("GstRtsp", "1.0")
    gi.require_version("GstRtspServer", "1.0")
    from gi.repository import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
        Gio,
        GLib,
        Gst,
        GstRtsp,
        GstRtspServer,
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("video")
    ap.add_argument("--protocols", choices=["tcp", "udp", "both"], default="both")
    ap.add_argument("--user")
    ap.add_argument("--password")
    codec = ap.add_mutually_exclusive_group()
    codec.add_argument("--h264", action="store_true", help="VIDEO is H.264 already: sent as it is, not re-encoded")
    codec.add_argument("--h265", action="store_true", help="VIDEO is H.265 already: sent as it is, not re-encoded")
    ap.add_argument("--tls-cert", help="serve rtsps:// with this certificate (PEM)")
    ap.add_argument("--tls-key", help="the certificate's private key (PEM)")
    args = ap.parse_args()
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    factory = GstRtspServer.RTSPMediaFactory()
    encode = "" if args.h264 or args.h265 else "decodebin ! videoconvert ! openh264enc complexity=low ! "
    send = "h265parse ! rtph265pay" if args.h265 else "h264parse ! rtph264pay"
    factory.set_launch(
        f'( filesrc location="{args.video}" ! qtdemux ! {encode}{send} name=pay0 pt=96 config-interval=1 )'
    )
    trans = {
        "tcp": GstRtsp.RTSPLowerTrans.TCP,
        "udp": GstRtsp.RTSPLowerTrans.UDP,
        "both": GstRtsp.RTSPLowerTrans.TCP | GstRtsp.RTSPLowerTrans.UDP,
    }
    factory.set_protocols(trans[args.protocols])
    if args.user or args.tls_cert:
        auth = GstRtspServer.RTSPAuth()
        token = GstRtspServer.RTSPToken()
        token.set_string(GstRtspServer.RTSP_TOKEN_MEDIA_FACTORY_ROLE, "viewer")
        if args.user:
            auth.add_basic(GstRtspServer.RTSPAuth.make_basic(args.user, args.password or ""), token)
        else:  # TLS only: anyone may watch
            auth.set_default_token(token)
        if args.tls_cert:
            auth.set_tls_certificate(Gio.TlsCertificate.new_from_files(args.tls_cert, args.tls_key))
        server.set_auth(auth)
        perms = GstRtspServer.RTSPPermissions()
        perms.add_role_from_structure(
            Gst.Structure.new_from_string(
                "viewer, media.factory.access=(boolean)true, media.factory.construct=(boolean)true"
            )
        )
        factory.set_permissions(perms)
    server.get_mount_points().add_factory("/cam", factory)
    if server.attach(None) == 0:
        print(f"cannot listen on {args.port}", file=sys.stderr)
        return 1
    print("ready", flush=True)
    GLib.MainLoop().run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
