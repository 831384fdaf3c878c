"""A run's configuration: the typed schema (every fact about a field declared on the field), safe YAML
reading and writing, and loading a file with overrides into a validated, frozen Config."""
