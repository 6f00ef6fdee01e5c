"""Second-stage models: after the primary model's detections are decoded and tracked, crops of the
chosen labels go to each secondary stage, batched across cameras and frames into that stage's fixed
batch; each detection carries what the stages said about it.

    loader.py   each stage's package at start: found, verified, admitted to the memory budget (the primary
                and every stage counted), opened and checked as the primary is (lifecycle/admission.py)
    pipeline.py the cascade between the scene and the publisher: crops handed to the stages, each result held
                until its stages answer, handed on in its camera's order (`StagedResult`, `build_cascade`)
    runner.py   a stage's thread: crops batched across cameras and frames into its fixed batch, run, decoded,
                voted; `StageModel` (one version of a stage) swapped by `Stage.flip` between two batches
    crops.py    boxes → crops (labels, minimum size, padding, most per frame, clipped); a crop → a stage's row
    votes.py    per track: when a stage reads it again (reinfer_frames, iou_change) and what its readings vote for
    swap.py     a stage's version pushed while serving: admitted, flipped in between batches, on probation of its
                own, committed or rolled back alone (`StageSwaps`, reached from the model manager)
"""
