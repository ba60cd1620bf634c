"""The thin kopf layer: it feeds watch events into kvpilot's loops and holds no business logic."""
