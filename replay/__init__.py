"""Journal format, checkpoint/restore, migration and record/replay.

Empty for now: the server's sessions already route every state-changing call through one
dispatch point (`vgpu.server.session.OPS`), which is where the journal will attach.
"""
