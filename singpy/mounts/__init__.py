"""Mount specifications: parsing, default contributors, guest paths, the executor."""
