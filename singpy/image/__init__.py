"""Image formats: detection, SIF parsing and writing, root filesystem preparation."""
