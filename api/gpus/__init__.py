"""GPUs: the box's inventory with leases, free memory and health."""
