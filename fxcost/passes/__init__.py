"""Graph passes. Each module is one pass with one public function ``run(gm, ...) -> gm`` that reads
``node.meta["val"]`` and ``node.meta["fxcost"]`` and writes only ``node.meta["fxcost"]``."""
