//! Where the traced kernel is in a running QEMU guest: its KASLR offset
//! from the attach's first stop (or why it is not this kernel), its
//! image's span, and the addresses of the sites the attach may write.

use vmm::Stopped;

use super::drive::QemuVm;
use super::error::QemuError;
use super::guest::QemuStop;
use crate::kernel::kaslr::{self, Detected, KernelOffset};
use crate::kernel::sites::SITE_LEN;
use crate::kernel::symbols::KernelImage;
use crate::plan::exitless::layout::PAGE;
use crate::plan::Plan;

/// The kernel image's virtual area: `__START_KERNEL_map` and its size with
/// KASLR (arch/x86/include/asm/page_64_types.h).
const KERNEL_MAP_BASE: u64 = vmm::layout::KERNEL_MAP_BASE;
const KERNEL_IMAGE_SIZE: u64 = 1 << 30;

/// Where the kernel runs (KASLR), from the first stop.
pub(super) fn kernel_offset(stop: &QemuStop<'_>, plan: &Plan) -> Result<KernelOffset, QemuError> {
    match kaslr::detect(stop, &plan.image) {
        Ok(Detected::Offset(o)) => Ok(o),
        Ok(_) => Err(not_found(stop, &plan.image)),
        Err(e) => Err(QemuError::NotTraceable(e.to_string())),
    }
}

/// Where the running kernel's image is (`_text` to `_end`), if its
/// symbols say.
pub(super) fn image_span(
    image: &KernelImage,
    offset: KernelOffset,
) -> Option<std::ops::Range<u64>> {
    let start = image.symbol("_text")?.addr;
    let end = image.symbol("_end")?.addr;
    Some(offset.runtime(start)..offset.runtime(end))
}

/// Why the kernel's banner was found nowhere: a kernel runs (its image's
/// virtual area maps memory) but not this one, or none runs yet. The
/// running kernel maps at least 2 MiB there, so one of the 2 MiB steps
/// lands in it.
fn not_found(stop: &QemuStop<'_>, image: &KernelImage) -> QemuError {
    // Any paged vCPU's tables: the kernel's image area is in every one.
    let mapped = stop.vcpu_spaces().into_iter().any(|mut v| {
        (0..KERNEL_IMAGE_SIZE / kaslr::KASLR_ALIGN).any(|i| {
            v.space
                .gpa(KERNEL_MAP_BASE + i * kaslr::KASLR_ALIGN)
                .is_ok()
        })
    });
    let banner = image
        .symbol(kaslr::BANNER)
        .and_then(|b| image.file_bytes(b.addr, usize::try_from(b.size).ok()?));
    match (mapped, banner) {
        (true, Some(b)) => QemuError::OtherKernel {
            path: image.path.clone(),
            banner: String::from_utf8_lossy(b)
                .trim_end_matches(['\0', '\n'])
                .to_string(),
        },
        _ => QemuError::NotTraceable(
            "no vCPU runs with the kernel's page tables, and its banner is not mapped (still in firmware or early boot?)".into(),
        ),
    }
}

/// Every site the attach may write, as it will find them (running and
/// guest-physical address, and where its bytes past the first page are
/// when it straddles two): a module's through the kernel's page tables
/// (its text is not in the image's linear mapping, and is mapped page by
/// page).
pub(super) fn site_addresses(
    vm: &QemuVm,
    plan: &Plan,
    offset: KernelOffset,
) -> Vec<(u64, u64, Option<u64>)> {
    let ram = vm.guest.ram();
    let image = &plan.image;
    let phys = |va: u64| super::modules::module_phys(&*ram, image, offset, va);
    plan.index
        .addrs
        .iter()
        .filter_map(|&a| {
            let va = offset.runtime(a);
            match image.module_at(va) {
                Some(_) => Some((va, phys(va)?, tail_of(va, phys)?)),
                None => Some((va, offset.phys_of(a)?, None)),
            }
        })
        .collect()
}

/// Where the bytes of the site at `va` past its first page are (`phys`
/// translates): `Some(None)` for a site within one page, None when its
/// second page is not mapped.
fn tail_of(va: u64, phys: impl Fn(u64) -> Option<u64>) -> Option<Option<u64>> {
    let next = (va | (PAGE - 1)) + 1;
    match next - va < SITE_LEN as u64 {
        true => phys(next).map(Some),
        false => Some(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_site_has_a_tail_only_across_a_page_boundary() {
        let phys = |va: u64| (va >= 0x2000).then_some(va + 0x10_0000);
        assert_eq!(tail_of(0x1ffb, phys), Some(None), "ends at the page's end");
        assert_eq!(tail_of(0x1ffc, phys), Some(Some(0x10_2000)));
        assert_eq!(tail_of(0xffc, phys), None, "its second page unmapped");
    }
}
