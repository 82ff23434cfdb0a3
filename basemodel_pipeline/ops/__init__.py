"""Operating a workspace once the stages have written it: what runs beside the pipeline, not inside it.

retention.py   deletes old versions of the workspace's artifacts by the config's retention policy
upload.py      copies finished workspace files to object storage (S3), `_PUBLISHED.json` last
alerts.py      alert messages and where they go (a log line, a webhook), secrets redacted
verify.py      checks every artifact of a workspace against its manifest (`basemodel verify`, the Dagster checks)

The layer sits above reports/ because verify reads what every stage wrote; the faces call it (the CLI's
`prune` and `verify`, Dagster's maintenance, upload, alert and check definitions; docs/architecture.md).
"""
