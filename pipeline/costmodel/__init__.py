"""The cost model: what one decoding step costs on a GPU type, and what a speculative method is worth.

``hardware`` holds each GPU type's published figures (memory bandwidth, dense tensor-core peaks,
interconnect), ``step`` what one decoding step is (the deployment, the method's drafting, the cost by
part), ``step_gpu`` the roofline of one step of the target model plus each method's own work on a GPU,
``step_cpu`` the step of the CPU reference backend, ``pricing`` picks one by the deployment's device,
``predict`` the speedup a mean acceptance length buys at each batch size.
"""
