//! The guest's loaded modules, read from a running QEMU guest and added
//! to the kernel image, so that `--trace` and `list` see their functions
//! (`name [module]`); said on stderr.

use tracer::kernel::symbols::KernelImage;
use tracer::qemu::session::Connected;

/// Add the modules `connected`'s guest has loaded to `image`, and say how
/// many. `traced`: an attach (Some("traced")) goes on without them and
/// says only why; `list` (None) also says when the kernel has none.
pub(super) fn add(connected: &Connected, image: &mut KernelImage, traced: Option<&str>) {
    match connected.modules(image) {
        Ok(Some(m)) => {
            let functions = image.add_modules(&m.list, m.layout, m.offset);
            for (addr, orc) in m.orc {
                image.set_module_orc(addr, orc);
            }
            note!(
                "vmtrace: {} loaded module{} in the guest ({functions} functions)",
                m.list.len(),
                if m.list.len() == 1 { "" } else { "s" }
            );
        }
        Ok(None) if traced.is_none() => note!("vmtrace: the guest's kernel has no modules"),
        Ok(None) => {}
        Err(e) => note!(
            "vmtrace: the guest's modules are not {}: {e}",
            traced.unwrap_or("listed")
        ),
    }
}
