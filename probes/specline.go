package probes

import (
	"strings"
	"unicode"
)

// SpecLine returns the one spec in text, a probe file's content: its
// lines without `# comment`s (a '#' that starts a word, outside a quoted
// site), blank and comment-only lines dropped, each trimmed. So the text
// of a probe file, which follows the spec with '# ' lines, reads back as
// its spec (`sed -i`, `cat a > b`). Several spec lines are a syntax
// error; none gives "".
func SpecLine(text string) (string, error) {
	spec := ""
	for line := range strings.SplitSeq(text, "\n") {
		line = strings.TrimSpace(stripComment(line))
		if line == "" {
			continue
		}
		if spec != "" {
			return "", syntaxErr("one spec per probe file, got %q and %q", spec, line)
		}
		spec = line
	}
	return spec, nil
}

// stripComment cuts line at a '#' that starts a word, after the quoted
// site if the line starts with one.
func stripComment(line string) string {
	from := 0
	if t := strings.TrimLeftFunc(line, unicode.IsSpace); strings.HasPrefix(t, `"`) {
		if end := strings.IndexByte(t[1:], '"'); end >= 0 {
			from = len(line) - len(t) + end + 2
		}
	}
	for i := from; i < len(line); i++ {
		if line[i] == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t') {
			return line[:i]
		}
	}
	return line
}

// cutQuoted takes a quoted site off the front of text, a C++ name with
// spaces such as `"geo::area(long, long)"+4`: it returns the name and text
// with `""` in its place, which parseSite reads as that symbol ("" and
// text unchanged when the site is not quoted).
func cutQuoted(text string) (string, string, error) {
	t := strings.TrimLeftFunc(text, unicode.IsSpace)
	if !strings.HasPrefix(t, `"`) {
		return "", text, nil
	}
	end := strings.IndexByte(t[1:], '"')
	if end < 0 {
		return "", "", syntaxErr("unterminated quoted site %s", t)
	}
	name := t[1 : end+1]
	if name == "" || strings.TrimSpace(name) != name {
		return "", "", syntaxErr("bad quoted site %q (want a symbol name, no leading or trailing space)", name)
	}
	for _, r := range name {
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return "", "", syntaxErr("bad quoted site %q: control character or invalid UTF-8", name)
		}
	}
	return name, `""` + t[end+2:], nil
}

// needsQuotes tells whether a symbol must be quoted to be read back as a
// site: it has spaces, or characters that would end the symbol or make it
// something else unquoted.
func needsQuotes(sym string) bool {
	if sym == "" || strings.ContainsAny(sym[:1], "0123456789$\\+-=:()@\"#") {
		return true
	}
	return strings.ContainsAny(sym, "%+=") || strings.IndexFunc(sym, unicode.IsSpace) >= 0
}

// quoteSymbol returns sym as a site writes it.
func quoteSymbol(sym string) string {
	if needsQuotes(sym) {
		return `"` + sym + `"`
	}
	return sym
}

// parseQuotedSite reads the rest of a quoted site, s.Symbol already taken
// (cutQuoted): `""` then nothing or +OFFSET.
func (s *Spec) parseQuotedSite(site, tok string) error {
	rest := strings.TrimPrefix(site, `""`)
	if rest == "" {
		return nil
	}
	off, ok := strings.CutPrefix(rest, "+")
	if !ok {
		return syntaxErr("bad site %q after the quoted symbol (want +OFFSET)", rest)
	}
	n, err := ParseUint(off)
	if err != nil {
		return syntaxErr("bad offset %q in site %q: %v", off, quoteSymbol(s.Symbol)+rest, err)
	}
	s.Offset = n
	return nil
}
