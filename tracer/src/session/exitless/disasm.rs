//! The trampoline's code as text, for listings and error messages.

use iced_x86::{Formatter, Instruction, IntelFormatter};

/// One instruction as `address  mnemonic operands`, Intel syntax, 0x hex.
pub fn format_instruction(instruction: &Instruction) -> String {
    let mut formatter = IntelFormatter::new();
    let options = formatter.options_mut();
    options.set_hex_prefix("0x");
    options.set_hex_suffix("");
    options.set_uppercase_hex(false);
    options.set_space_after_operand_separator(true);
    // Show ring displacements as the addresses they are (0xffff...), not as
    // negative offsets from r10.
    options.set_signed_memory_displacements(false);
    let mut text = String::new();
    formatter.format(instruction, &mut text);
    format!("{:016x}  {text}", instruction.ip())
}
