"""The compile options every gluon kernel of the backend is built with, beside each kernel's ``num_warps``."""

#: Multiplies feeding adds fused into one rounding (``FFMA``), as the kernels were measured and checked with (the FP8
#: promotion's scale-and-accumulate among them). Triton fuses by default up to 3.9, warns from 3.9 when the option is
#: left unset, and announces separate rounding as the default of 3.10: so it is spelled out.
COMPILE_OPTIONS = {"enable_fp_fusion": True}
