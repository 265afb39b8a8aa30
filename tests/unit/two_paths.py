"""A topology with a choice of path, shared by the unit tests of CES's network decision."""

from topologies import parse_topology

# a and b, two 1-core nodes; s1-s2 direct (100 Mbit/s) or around through s3 (500 Mbit/s)
TWO_PATHS = parse_topology(
    {
        "name": "twopaths",
        "switches": [{"name": "s1"}, {"name": "s2"}, {"name": "s3"}],
        "nodes": [{"name": "a", "cpu": 1, "mem_mb": 2048}, {"name": "b", "cpu": 1, "mem_mb": 2048}],
        "links": [
            {"ends": ["a", "s1"], "bw_mbps": 1000},
            {"ends": ["b", "s2"], "bw_mbps": 1000},
            {"ends": ["s1", "s2"], "bw_mbps": 100},
            {"ends": ["s1", "s3"], "bw_mbps": 500},
            {"ends": ["s3", "s2"], "bw_mbps": 500},
        ],
    },
    "twopaths",
)
