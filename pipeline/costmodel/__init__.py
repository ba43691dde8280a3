"""The cost model: what one decoding step costs on a GPU type, and what a speculative method is worth.

``hardware`` holds each GPU type's published figures (memory bandwidth, dense tensor-core peaks,
interconnect), ``step`` the roofline of one step of the target model plus each method's own work,
``predict`` the speedup a mean acceptance length buys at each batch size.
"""
