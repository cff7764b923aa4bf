"""Configuration files: singpy.conf and the GPU library lists (*liblist.conf)."""
