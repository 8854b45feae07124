# The detection probe: 64-bit user mode (CPL3), position independent, no stack use.
#
# Entry: rdi = address of a u64 counter, rsi = iterations (> 0), rdx = an address outside every
# memslot. Adds 1 to the counter rsi times, then stores the counter to [rdx] (an MMIO exit).
# Run natively this takes about a nanosecond per iteration; emulated instruction by instruction
# in the host kernel it takes microseconds.

.intel_syntax noprefix

.text
.globl _start
_start:
    inc qword ptr [rdi]
    dec rsi
    jnz _start
    mov rax, [rdi]
    mov [rdx], rax
halt:
    pause
    jmp halt
