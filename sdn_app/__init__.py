"""CES SDN app: the Network Controller's hands in the switches.

An OpenFlow 1.3 controller app (Ryu API; runs on os-ken via `python -m sdn_app`, or under
`ryu-manager`) that installs each scheduled flow's path and meter, forwards unscheduled traffic
along shortest paths, polls statistics, and serves a REST API; `sdn_app.client.SdnClient` is the
typed client for that API. This package's top level imports no controller framework, so the
client can be used anywhere.
"""
