package session

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tree writes files (path → content) below a new temp dir.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestDetect(t *testing.T) {
	pt := "bus/event_source/devices/intel_pt/"
	cases := []struct {
		name     string
		sysfs    map[string]string
		readme   string
		want     Mode
		wantErr  string // of --mode=ptw
		wantText []string
	}{
		{name: "no PT", sysfs: map[string]string{"x": ""}, readme: "uprobe_events",
			want: ModeClassic, wantErr: "no Intel PT",
			wantText: []string{"intel_pt: no (no Intel PT", "ptwrite: no (no Intel PT)", "ptw uprobes: no (kernel without ptwrite uprobes"}},
		{name: "PT without PTWRITE", sysfs: map[string]string{pt + "type": "8", pt + "caps/ptwrite": "0"}, readme: "  ptw[:[GRP/][EVENT]] PATH:OFFSET [FETCHARGS]",
			want: ModeClassic, wantErr: "CPU without PTWRITE",
			wantText: []string{"intel_pt: yes", "ptwrite: no (CPU without PTWRITE", "ptw uprobes: yes"}},
		{name: "PTWRITE, stock kernel (README mentions only ptwrite)", sysfs: map[string]string{pt + "type": "8", pt + "caps/ptwrite": "1\n", pt + "format/ptw": "config:12"}, readme: "  p[:[GRP/][EVENT]] PATH\n  ptwrite is not a probe type here",
			want: ModeClassic, wantErr: "kernel without ptwrite uprobes",
			wantText: []string{"ptwrite: yes", "ptw uprobes: no"}},
		{name: "PTWRITE without the ptw format bit", sysfs: map[string]string{pt + "type": "8", pt + "caps/ptwrite": "1"}, readme: "ptw:",
			want: ModeClassic, wantErr: "ptw format bit"},
		{name: "everything", sysfs: map[string]string{pt + "type": "8", pt + "caps/ptwrite": "1", pt + "format/ptw": "config:12"}, readme: "  ptw[:[GRP/][EVENT]] PATH:OFFSET [FETCHARGS]",
			want: ModeClassic, wantErr: "no Intel PT capture engine",
			wantText: []string{"intel_pt: yes", "ptwrite: yes", "ptw uprobes: yes"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := roots{sysfs: tree(t, c.sysfs), dev: tree(t, map[string]string{"null": ""})}
			tfs := tree(t, map[string]string{"uprobe_events": "", "README": c.readme})
			caps := r.detect(tfs, nil)
			got, why, err := caps.Choose(ModeAuto)
			if err != nil || got != c.want || why == "" {
				t.Errorf("auto: %v %q %v, want %v", got, why, err, c.want)
			}
			if got, _, err := caps.Choose(ModeClassic); err != nil || got != ModeClassic {
				t.Errorf("classic: %v %v", got, err)
			}
			if _, _, err := caps.Choose(ModePTW); err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("ptw: %v, want an error saying %q", err, c.wantErr)
			}
			text := string(caps.AppendText(nil))
			for _, w := range append(c.wantText, "tracefs: yes", "uprobes: yes", "fuse: no (no /dev/fuse)") {
				if !strings.Contains(text, w) {
					t.Errorf("text lacks %q:\n%s", w, text)
				}
			}
		})
	}
	t.Run("no tracefs", func(t *testing.T) {
		caps := roots{sysfs: t.TempDir(), dev: t.TempDir()}.detect("", errors.New("mount: permission denied"))
		if _, _, err := caps.Choose(ModeAuto); err == nil || !strings.Contains(err.Error(), "no uprobes") {
			t.Errorf("auto without tracefs: %v", err)
		}
		if text := string(caps.AppendText(nil)); !strings.Contains(text, "tracefs: no (mount: permission denied)") {
			t.Errorf("text:\n%s", text)
		}
	})
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"auto", "classic", "ptw"} {
		if m, err := ParseMode(s); err != nil || string(m) != s {
			t.Errorf("ParseMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := ParseMode("fast"); err == nil {
		t.Error("ParseMode(fast) succeeded")
	}
}
