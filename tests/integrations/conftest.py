"""Every Ray cluster these tests start is local to this machine: set before anything imports ray
(Ray reads it at import), inherited by every Ray process and by `main_ppo`'s subprocess. On Linux,
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes Ray take 127.0.0.1 as the node address, so that its
servers (GCS, raylet, workers, object manager) listen on the loopback interface only; without
it they listen on every interface."""

import os

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
