//! A small Rust lexer: identifiers, punctuation, literals, lifetimes and
//! comments, with their lines; enough to find items, paths and bodies.

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    Ident(String),
    Punct(char),
    Lit,
    Lifetime,
    Comment(String),
}

#[derive(Clone, Debug)]
pub struct Tok {
    pub kind: Kind,
    pub line: usize,
}

impl Tok {
    pub fn is(&self, s: &str) -> bool {
        matches!(&self.kind, Kind::Ident(i) if i == s)
    }
    pub fn is_punct(&self, c: char) -> bool {
        self.kind == Kind::Punct(c)
    }
    pub fn ident(&self) -> Option<&str> {
        match &self.kind {
            Kind::Ident(i) => Some(i),
            _ => None,
        }
    }
}

pub struct Lexer {
    c: Vec<char>,
    i: usize,
    line: usize,
}

impl Lexer {
    fn at(&self, k: usize) -> char {
        self.c.get(self.i + k).copied().unwrap_or('\0')
    }

    fn bump(&mut self) -> char {
        let ch = self.at(0);
        self.i += 1;
        if ch == '\n' {
            self.line += 1;
        }
        ch
    }

    /// A quoted string from the opening quote: escapes, or none if raw.
    fn string(&mut self, raw: bool, hashes: usize) {
        self.bump();
        while self.i < self.c.len() {
            let ch = self.bump();
            if ch == '\\' && !raw {
                self.bump();
            } else if ch == '"' && (0..hashes).all(|k| self.at(k) == '#') {
                self.i += hashes;
                return;
            }
        }
    }

    /// A raw string if one starts here after a prefix of `skip` chars.
    fn raw_string(&mut self, skip: usize) -> bool {
        let mut k = skip;
        while self.at(k) == '#' {
            k += 1;
        }
        if self.at(k) != '"' {
            return false;
        }
        self.i += k;
        self.string(true, k - skip);
        true
    }
}

pub fn lex(src: &str) -> Vec<Tok> {
    let mut lx = Lexer {
        c: src.chars().collect(),
        i: 0,
        line: 1,
    };
    let mut out = Vec::new();
    while lx.i < lx.c.len() {
        let line = lx.line;
        let ch = lx.at(0);
        let kind = if ch.is_whitespace() {
            lx.bump();
            continue;
        } else if ch == '/' && lx.at(1) == '/' {
            let start = lx.i;
            while lx.i < lx.c.len() && lx.at(0) != '\n' {
                lx.i += 1;
            }
            Kind::Comment(lx.c[start..lx.i].iter().collect())
        } else if ch == '/' && lx.at(1) == '*' {
            let start = lx.i;
            let mut depth = 0;
            while lx.i < lx.c.len() {
                if lx.at(0) == '/' && lx.at(1) == '*' {
                    depth += 1;
                    lx.i += 2;
                } else if lx.at(0) == '*' && lx.at(1) == '/' {
                    depth -= 1;
                    lx.i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    lx.bump();
                }
            }
            Kind::Comment(lx.c[start..lx.i].iter().collect())
        } else if ch == '"' {
            lx.string(false, 0);
            Kind::Lit
        } else if ch == '\'' {
            if lx.at(1) == '\\' {
                lx.i += 2;
                while lx.at(0) != '\'' {
                    lx.bump();
                }
                lx.i += 1;
                Kind::Lit
            } else if lx.at(2) == '\'' {
                lx.i += 3;
                Kind::Lit
            } else {
                lx.i += 1;
                while lx.at(0).is_alphanumeric() || lx.at(0) == '_' {
                    lx.i += 1;
                }
                Kind::Lifetime
            }
        } else if ch.is_ascii_digit() {
            while lx.at(0).is_alphanumeric()
                || lx.at(0) == '_'
                || (lx.at(0) == '.' && lx.at(1).is_ascii_digit())
            {
                lx.i += 1;
            }
            Kind::Lit
        } else if ch.is_alphabetic() || ch == '_' {
            // String and char literals with a prefix: r"", r#""#, b"", br"", b'', c"".
            let (a, b) = (lx.at(1), lx.at(2));
            if ch == 'r' && (a == '"' || a == '#') && lx.raw_string(1) {
                out.push(Tok {
                    kind: Kind::Lit,
                    line,
                });
                continue;
            }
            if (ch == 'b' || ch == 'c') && a == 'r' && (b == '"' || b == '#') && lx.raw_string(2) {
                out.push(Tok {
                    kind: Kind::Lit,
                    line,
                });
                continue;
            }
            if (ch == 'b' || ch == 'c') && a == '"' {
                lx.i += 1;
                lx.string(false, 0);
                out.push(Tok {
                    kind: Kind::Lit,
                    line,
                });
                continue;
            }
            if ch == 'b' && a == '\'' {
                lx.i += 1;
                continue; // the char literal is lexed next round
            }
            if ch == 'r' && a == '#' {
                lx.i += 2; // a raw identifier
            }
            let start = lx.i;
            while lx.at(0).is_alphanumeric() || lx.at(0) == '_' {
                lx.i += 1;
            }
            Kind::Ident(lx.c[start..lx.i].iter().collect())
        } else {
            lx.bump();
            Kind::Punct(ch)
        };
        out.push(Tok { kind, line });
    }
    out
}
