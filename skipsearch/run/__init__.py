"""A run end to end: the pipeline, its report and the exports to inference engines."""
