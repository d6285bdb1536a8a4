"""Jobs: one module per task kind; each exposes ``run(cfg, out_dir) -> summary``."""
