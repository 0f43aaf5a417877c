"""Link rates the measured step times cannot pin on their own, held to the hardware's published limits.

An H200 SXM's NVLink carries 900 GB/s in both directions together, 450 GB/s each way: a collective's
bus bandwidth between two of its GPUs cannot exceed that. The records' step times set the lower side
(a slower link plans the two-GPU records too slow); nothing but the link itself sets the upper one.
"""

from __future__ import annotations

from planner import constants as C

H200_NVLINK_BYTES_PER_S_EACH_WAY = 450e9
PCIE5_X16_BYTES_PER_S_EACH_WAY = 63e9


def test_the_planned_nvlink_rate_is_within_what_the_link_carries() -> None:
    assert C.NVLINK_BYTES_PER_S <= H200_NVLINK_BYTES_PER_S_EACH_WAY
    # and above what PCIe could carry: the two GPUs talk over NVLink, not the host bus
    assert C.NVLINK_BYTES_PER_S > PCIE5_X16_BYTES_PER_S_EACH_WAY
