"""Delivery: the device's MQTT session, what goes out over it and what comes in.

    inference ──submit()──> bounded queue ──publisher thread──> spool (SQLite WAL) ──> paho ──> broker
                                                           PUBACK deletes the row <──┘
    broker ──> inbox (subscriptions, routing) ──> command channel | OTA data | group offers

Topics and payload shapes come from ``edged.protocol``; nothing here builds a topic string by hand.

    publisher.py     results, events, status and telemetry: sequence numbers, the spool, the session
    payload.py       a result as it goes out on ``…/results/<camera>`` (edged.result/2)
    session.py       one paho client on edged's own supervised network thread (the watchdog watches it)
    client.py        the device's paho client: writes kept on the network thread, per-message costs cut
    inbox.py         the device's subscriptions, and where each incoming message goes
    commands.py      the command channel: strict parsing, expiry, one at a time, a reply for every command
    homeassistant.py Home Assistant MQTT discovery and per-camera state topics
    upload.py        files off the device by HTTP PUT (clips, labelling frames): a durable, bounded queue
    spool/           the durable spool: messages wait in SQLite until the broker acknowledges them
"""
