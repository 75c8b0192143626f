//! A journaled site's five bytes in guest memory. A kernel image's site
//! is one run of physical memory (its linear mapping), but module text
//! is mapped page by page: a module site straddling two pages has its
//! bytes past the first page elsewhere (`JournaledSite::tail`), and the
//! attach, the load hook and the repair read and write both pieces.

use vm_memory::GuestAddress;
use vmm::GuestRam;

use super::journal::JournaledSite;
use crate::kernel::sites::SITE_LEN;
use crate::plan::exitless::layout::PAGE;

impl JournaledSite {
    /// (guest-physical address, range of the site's bytes) of each piece.
    fn pieces(&self) -> Vec<(u64, std::ops::Range<usize>)> {
        let in_page = (PAGE - (self.gpa % PAGE)) as usize;
        match self.tail {
            Some(tail) if in_page < SITE_LEN => {
                vec![(self.gpa, 0..in_page), (tail, in_page..SITE_LEN)]
            }
            _ => vec![(self.gpa, 0..SITE_LEN)],
        }
    }

    /// The site's bytes as the guest holds them now.
    pub fn read(&self, ram: &dyn GuestRam) -> Result<[u8; SITE_LEN], String> {
        let mut bytes = [0u8; SITE_LEN];
        for (gpa, r) in self.pieces() {
            ram.read_slice(&mut bytes[r], GuestAddress(gpa))
                .map_err(|e| e.to_string())?;
        }
        Ok(bytes)
    }

    /// Writes the site's bytes (under a stop: the guest runs none of
    /// them between the two pieces).
    pub fn write(&self, ram: &dyn GuestRam, bytes: &[u8; SITE_LEN]) -> Result<(), String> {
        for (gpa, r) in self.pieces() {
            ram.write_slice(&bytes[r], GuestAddress(gpa))
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    #[test]
    fn a_site_across_two_pages_is_read_and_written_in_its_two_pieces() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let ram: &dyn GuestRam = &mem;
        // Its first 2 bytes end page 0x3000, its last 3 start page 0x8000
        // (not the next page: module text is mapped page by page).
        let site = JournaledSite {
            va: 0xffff_ffff_c000_0ffe,
            gpa: 0x3ffe,
            original: String::new(),
            tail: Some(0x8000),
        };
        ram.write_slice(&[0x0f, 0x1f], GuestAddress(0x3ffe))
            .unwrap();
        ram.write_slice(&[0x44, 0, 0], GuestAddress(0x8000))
            .unwrap();
        ram.write_slice(&[0xcc; 3], GuestAddress(0x4000)).unwrap();
        assert_eq!(site.read(ram).unwrap(), [0x0f, 0x1f, 0x44, 0, 0]);
        site.write(ram, &[0xe8, 1, 2, 3, 4]).unwrap();
        let mut b = [0u8; 3];
        ram.read_slice(&mut b, GuestAddress(0x8000)).unwrap();
        assert_eq!(b, [2, 3, 4]);
        ram.read_slice(&mut b, GuestAddress(0x4000)).unwrap();
        assert_eq!(b, [0xcc; 3], "the page after the first is not the site's");
        assert_eq!(site.read(ram).unwrap(), [0xe8, 1, 2, 3, 4]);
        // In one page, or a journal from before: one run at `gpa`.
        let whole = JournaledSite { tail: None, ..site };
        assert_eq!(whole.read(ram).unwrap(), [0xe8, 1, 0xcc, 0xcc, 0xcc]);
    }

    #[test]
    fn a_journal_without_tails_still_reads() {
        let old = r#"{"va":1,"gpa":2,"original":"0f1f440000"}"#;
        let site: JournaledSite = serde_json::from_str(old).unwrap();
        assert_eq!(site.tail, None);
        assert!(!serde_json::to_string(&site).unwrap().contains("tail"));
    }
}
