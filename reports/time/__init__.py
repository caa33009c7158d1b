"""Time: the roofline of op time against compute and memory roofs."""
