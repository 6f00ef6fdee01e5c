"""Evidence kept on the device: video clips around events, and the frames worth labelling, each in a
bounded store under the state directory, listed and fetched through the local HTTP server, and uploaded
by HTTP PUT to a configured endpoint.

"""
