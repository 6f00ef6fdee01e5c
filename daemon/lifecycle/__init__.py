"""The model's life on the device: which version serves at a start, how a new one is taken in over the air,
swapped in between two batches, judged on probation, and committed or rolled back (docs/models.md,
"Over-the-air push and hot swap").

    start:  loader ──> admission ──> backend opened, warmed up ──> serving
    push:   ota/ (offer, transfer) ──> verified stage ──> manager: admit ──> load + warm up ──> flip
            ──> probation ──> commit | roll back
    shadow: ota/ ──> verified stage ──> manager: both fit ──> candidate loaded beside ──> shadow.py on
            sampled live frames ──> passed: the flip above | failed, no evidence: discarded

    loader.py       the model a start serves: found, judged (the crash-loop rollback), opened, admitted
    admission.py    what a model must pass before it serves: I/O, golden pair, batches, memory estimate
    manager.py      `ModelManager`: swaps in the running daemon (side by side or stop-the-world)
    probation.py    what a swapped-in version is judged against, and the verdicts that roll it back
    shadow.py       a candidate evaluated beside the serving model on sampled live frames: runner, report, verdict
    agreement.py    serving against candidate detections: matching by label and IoU, and the report's figures
    remote.py       signed config documents (remote configuration): checked, applied by reload, reverted
                    when the device is not ready again in time, kept in the state dir
    ota/            the over-the-air receiver: offers, one transfer at a time, chunks over MQTT or files
                    over HTTP(S), a group's retained offer
"""
