"""What a task's labels are made of, below the task classes (docs/tasks.md): the label types and the target
spec (labels.py), the events API of targets and its column predicates (events.py), the candidate examples
(windows.py), Python target functions (python.py) and their time limit (time_limit.py)."""
