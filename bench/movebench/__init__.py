"""The pieces of bench/migrate.py, by what each measures."""
