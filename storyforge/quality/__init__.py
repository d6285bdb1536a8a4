"""Looking across outputs: near-duplicates (:mod:`.dedup`) and variety (:mod:`.diversity`).

Both take plain typed settings and texts, never a config object, so every executor and task
can call them.
"""
