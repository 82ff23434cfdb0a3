"""Extract assets: one per data source in the config."""
