"""Experimental forms of the layer, kept out of the core: reached from `HierarchicalAttention.forward` only by name (`impl="flex"`), measured by the GPU check."""
