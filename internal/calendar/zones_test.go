package calendar

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// A zone is loaded from the data the binary embeds, never from the machine's: here $ZONEINFO
// names a directory whose Europe/Berlin holds Tokyo's rules, as an image with other zone data
// would. It runs in a child process of the test binary, whose time package has not yet read
// $ZONEINFO (the standard library reads it once, and prefers it to its embedded copy).
func TestZonesComeFromTheEmbeddedData(t *testing.T) {
	summer := time.Date(2026, time.July, 1, 12, 0, 0, 0, time.UTC)
	if os.Getenv("CALENDAR_ZONE_CHILD") == "1" {
		loc, err := LoadZone("Europe/Berlin")
		if err != nil {
			t.Fatal(err)
		}
		if _, off := summer.In(loc).Zone(); off != 2*3600 {
			t.Fatalf("Europe/Berlin's offset on 1 July: %ds, want 7200 (Berlin's summer time, not the machine's data)", off)
		}
		std, err := time.LoadLocation("Europe/Berlin")
		if err != nil {
			t.Fatal(err)
		}
		if _, off := summer.In(std).Zone(); off != 9*3600 {
			t.Fatalf("the standard library's Europe/Berlin: %ds; want the machine's (Tokyo's, 32400): the test shows nothing", off)
		}
		return
	}
	tokyo, err := zones().files["Asia/Tokyo"].Open()
	if err != nil {
		t.Fatal(err)
	}
	defer tokyo.Close()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "Europe"), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "Europe", "Berlin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadFrom(tokyo); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestZonesComeFromTheEmbeddedData$", "-test.count=1")
	cmd.Env = append(os.Environ(), "CALENDAR_ZONE_CHILD=1", "ZONEINFO="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
}

// Names outside the data are refused, whatever they look like on a disk.
func TestUnknownZones(t *testing.T) {
	for _, name := range []string{"Europe/Atlantis", "../../etc/passwd", "/etc/localtime", "europe/berlin", "Europe/Berlin/"} {
		if _, err := LoadZone(name); err == nil {
			t.Errorf("LoadZone(%q) succeeded", name)
		}
	}
	for _, name := range []string{"Europe/Berlin", "America/Santiago", "Australia/Lord_Howe", "UTC", ""} {
		if _, err := LoadZone(name); err != nil {
			t.Errorf("LoadZone(%q): %v", name, err)
		}
	}
}
