"""Second-stage models: after the primary model's detections are decoded and tracked, crops of the
chosen labels go to each secondary stage, batched across cameras and frames into that stage's fixed
batch; each detection carries what the stages said about it.

"""
