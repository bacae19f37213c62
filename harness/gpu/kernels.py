"""PTX for the kernels check_assumptions.py launches (JIT-compiled by the driver:
cuModuleLoadData; no compilation step). tests/python_gpu assembles it with ptxas
when the toolkit has one."""

PTX = r""".version 7.0
.target sm_70
.address_size 64

// spw_add_u32(unsigned *p, unsigned long long n, unsigned v): p[i] += v, grid-stride.
.visible .entry spw_add_u32(
	.param .u64 spw_add_u32_p,
	.param .u64 spw_add_u32_n,
	.param .u32 spw_add_u32_v
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<10>;

	ld.param.u64 	%rd1, [spw_add_u32_p];
	ld.param.u64 	%rd2, [spw_add_u32_n];
	ld.param.u32 	%r1, [spw_add_u32_v];
	cvta.to.global.u64 	%rd1, %rd1;
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %ntid.x;
	mov.u32 	%r4, %tid.x;
	cvt.u64.u32 	%rd4, %r4;
	mad.wide.u32 	%rd3, %r2, %r3, %rd4;
	mov.u32 	%r5, %nctaid.x;
	mul.wide.u32 	%rd5, %r5, %r3;
$L_loop:
	setp.ge.u64 	%p1, %rd3, %rd2;
	@%p1 bra 	$L_done;
	shl.b64 	%rd6, %rd3, 2;
	add.s64 	%rd7, %rd1, %rd6;
	ld.global.u32 	%r6, [%rd7];
	add.s32 	%r7, %r6, %r1;
	st.global.u32 	[%rd7], %r7;
	add.s64 	%rd3, %rd3, %rd5;
	bra.uni 	$L_loop;
$L_done:
	ret;
}

// spw_spin_add_u32(unsigned *p, unsigned long long n, unsigned long long cycles):
// each thread reads p[its first index], spins `cycles` clock cycles, then adds 1
// to its grid-stride elements: the range is in use from start to end.
.visible .entry spw_spin_add_u32(
	.param .u64 spw_spin_add_u32_p,
	.param .u64 spw_spin_add_u32_n,
	.param .u64 spw_spin_add_u32_cycles
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<14>;

	ld.param.u64 	%rd1, [spw_spin_add_u32_p];
	ld.param.u64 	%rd2, [spw_spin_add_u32_n];
	ld.param.u64 	%rd11, [spw_spin_add_u32_cycles];
	cvta.to.global.u64 	%rd1, %rd1;
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %ntid.x;
	mov.u32 	%r4, %tid.x;
	cvt.u64.u32 	%rd4, %r4;
	mad.wide.u32 	%rd3, %r2, %r3, %rd4;
	mov.u32 	%r5, %nctaid.x;
	mul.wide.u32 	%rd5, %r5, %r3;
	mov.u32 	%r1, 0;
	setp.ge.u64 	%p2, %rd3, %rd2;
	@%p2 bra 	$S_spin_start;
	shl.b64 	%rd6, %rd3, 2;
	add.s64 	%rd7, %rd1, %rd6;
	ld.volatile.global.u32 	%r1, [%rd7];
$S_spin_start:
	mov.u64 	%rd8, %clock64;
$S_spin:
	mov.u64 	%rd9, %clock64;
	sub.s64 	%rd10, %rd9, %rd8;
	setp.lt.u64 	%p1, %rd10, %rd11;
	@%p1 bra 	$S_spin;
	// keep the early load alive: add (value & 0) to the first element's increment
	and.b32 	%r1, %r1, 0;
	add.s32 	%r1, %r1, 1;
$S_loop:
	setp.ge.u64 	%p1, %rd3, %rd2;
	@%p1 bra 	$S_done;
	shl.b64 	%rd6, %rd3, 2;
	add.s64 	%rd7, %rd1, %rd6;
	ld.global.u32 	%r6, [%rd7];
	add.s32 	%r7, %r6, %r1;
	st.global.u32 	[%rd7], %r7;
	add.s64 	%rd3, %rd3, %rd5;
	bra.uni 	$S_loop;
$S_done:
	ret;
}
"""
