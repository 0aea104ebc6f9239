"""Watching a run while it trains: `fab watch` (a full-screen live view), the per-host lines under
`fab train`'s progress bar, and `fab tensorboard` (TensorBoard on rank 0's host through an SSH tunnel).

feed        reads each host's samples.jsonl (train.agent.measure.monitor) and rank 0's train.log over one
            persistent SSH connection per host, new bytes only
screen      turns what the hosts said into what the view shows, through the report's analysis
            (train.report.answers): the same definitions, the same verdict
render      the view as rich text (80x24 and up), and the compact per-host line
live        the refresh loop until Ctrl-C
tensorboard TensorBoard bound to 127.0.0.1 on rank 0's host, forwarded to the controller
"""
