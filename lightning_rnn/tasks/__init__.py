"""Tasks run by the command line (``task=train|test|sample|benchmark``): one module per
task, each with a ``run(cfg)`` that ``conf/task/NAME.yaml`` points at."""
