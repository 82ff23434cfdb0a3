"""Infrastructure every domain uses: the Deployment each `defs()` is built from, resources per environment,
the launcher (and its GPU reservations), code versions, automation conditions, the scenarios partitions, the
graph's shape, and how an asset runs a stage (in-process or through Pipes). Defines no asset, check, job,
schedule or sensor itself."""
