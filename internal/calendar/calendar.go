// Package calendar computes the periods of calendar windows: days, weeks and months in a named
// time zone, whose lengths vary (a day of a DST change is 23 or 25 hours, a month 28 to 31
// days). Every replica computes the same boundaries for the same instant from the zone data
// its binary embeds (zoneinfo_zip.go, never the image's own), so the boundaries need no
// coordination: the limiter names a period's Redis key by its start, and Redis's clock picks
// the period (see package limiter).
//
// The package imports nothing of Kubernetes: the controller validates with it, the policies
// document checks with it, the sidecar decides with it.
package calendar

import (
	"archive/zip"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

//go:generate go run mkzoneinfo.go

// Unit is the length of a calendar period. The values match the API's enum.
type Unit string

// The units.
const (
	Day   Unit = "Day"
	Week  Unit = "Week"
	Month Unit = "Month"
)

// MaxZoneName bounds a zone's name (the longest IANA name is about 32 bytes).
const MaxZoneName = 64

// Spec says which periods: a Unit in a Zone (an IANA name; empty is UTC), weeks starting on
// FirstWeekday (other units ignore it), months on BillingDay (1-31; 0 is 1).
//
// A billing day past a month's last day starts that month's period on its last day: with
// billing day 31 the periods start on Jan 31, Feb 28 (29 in a leap year), Mar 31, Apr 30.
type Spec struct {
	Unit         Unit
	Zone         string
	FirstWeekday time.Weekday
	BillingDay   int
}

// Calendar computes the periods of a Spec. It is immutable and safe for concurrent use.
type Calendar struct {
	spec Spec
	loc  *time.Location
}

// ErrInvalid is wrapped by every error of New.
var ErrInvalid = errors.New("invalid calendar window")

// New checks spec and loads its zone.
func New(spec Spec) (*Calendar, error) {
	switch spec.Unit {
	case Day, Week, Month:
	default:
		return nil, fmt.Errorf("%w: unknown unit %q (want Day, Week or Month)", ErrInvalid, spec.Unit)
	}
	if spec.FirstWeekday < time.Sunday || spec.FirstWeekday > time.Saturday {
		return nil, fmt.Errorf("%w: first weekday %d", ErrInvalid, spec.FirstWeekday)
	}
	if spec.BillingDay < 0 || spec.BillingDay > 31 {
		return nil, fmt.Errorf("%w: billing day %d not in 1..31", ErrInvalid, spec.BillingDay)
	}
	if spec.Unit != Month && spec.BillingDay != 0 {
		return nil, fmt.Errorf("%w: a billing day is only for Month", ErrInvalid)
	}
	loc, err := LoadZone(spec.Zone)
	if err != nil {
		return nil, err
	}
	return &Calendar{spec: spec, loc: loc}, nil
}

// LoadZone loads an IANA zone by name from the embedded data ("" and "UTC" are UTC). It refuses
// "Local", which means a different zone on every machine.
func LoadZone(name string) (*time.Location, error) {
	switch {
	case name == "" || name == "UTC":
		return time.UTC, nil
	case len(name) > MaxZoneName:
		return nil, fmt.Errorf("%w: time zone name longer than %d bytes", ErrInvalid, MaxZoneName)
	case name == "Local":
		return nil, fmt.Errorf("%w: time zone Local differs between machines; name the zone, such as Europe/Berlin", ErrInvalid)
	}
	loc, err := zones().load(name)
	if err != nil {
		return nil, fmt.Errorf("%w: unknown time zone %q (an IANA name such as Europe/Berlin or America/New_York)", ErrInvalid, name)
	}
	return loc, nil
}

// zoneData is the embedded zone data: its entries by name, and the zones loaded so far (at
// most one per entry, so the cache is bounded by the data, whatever names are asked for).
type zoneData struct {
	files  map[string]*zip.File
	mu     sync.Mutex
	loaded map[string]*time.Location
}

// zones reads the embedded data's directory once. time.LoadLocation is not used: it prefers
// $ZONEINFO and the image's /usr/share/zoneinfo to the embedded copy, and replicas built into
// images with other zone data would disagree on the boundaries of a zone whose rules changed.
var zones = sync.OnceValue(func() *zoneData {
	r, err := zip.NewReader(strings.NewReader(zoneinfoZip), int64(len(zoneinfoZip)))
	if err != nil {
		panic(fmt.Sprintf("calendar: the embedded zone data: %v", err)) // generated: cannot happen
	}
	z := &zoneData{files: make(map[string]*zip.File, len(r.File)), loaded: map[string]*time.Location{}}
	for _, f := range r.File {
		z.files[f.Name] = f
	}
	return z
})

// load returns the zone named name, from the cache or the data.
func (z *zoneData) load(name string) (*time.Location, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if loc, ok := z.loaded[name]; ok {
		return loc, nil
	}
	f, ok := z.files[name]
	if !ok || f.UncompressedSize64 > 1<<20 {
		return nil, errors.New("no such zone")
	}
	rc, err := f.Open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, 1<<20))
	if err != nil {
		return nil, err
	}
	loc, err := time.LoadLocationFromTZData(name, data)
	if err != nil {
		return nil, err
	}
	z.loaded[name] = loc
	return loc, nil
}

// Spec returns what c was made of.
func (c *Calendar) Spec() Spec { return c.spec }

// MaxLength is the longest a period of c can be: what a window's length stands for where one
// length is needed (the local fallback's bounds, a lease's horizon).
func (c *Calendar) MaxLength() time.Duration {
	switch c.spec.Unit {
	case Day:
		return 26 * time.Hour // a DST change is an hour, Lord Howe's half of one; 26h bounds both
	case Week:
		return 7*24*time.Hour + 2*time.Hour
	default:
		return 31*24*time.Hour + 2*time.Hour
	}
}

// Period returns the period containing t: start <= t < end.
func (c *Calendar) Period(t time.Time) (start, end time.Time) {
	start = c.startOf(t)
	if t.Before(start) {
		// A day a DST change starts late (see midnight): t is in the day before.
		start = c.startOf(start.Add(-time.Nanosecond))
	}
	return start, c.next(start)
}

// PeriodMS is Period in Unix milliseconds: the form the limiter and its scripts use.
func (c *Calendar) PeriodMS(ms int64) (start, end int64) {
	s, e := c.Period(time.UnixMilli(ms))
	return s.UnixMilli(), e.UnixMilli()
}

// startOf is the start of the period whose calendar date holds t's date in the zone.
func (c *Calendar) startOf(t time.Time) time.Time {
	y, m, d := t.In(c.loc).Date()
	switch c.spec.Unit {
	case Week:
		back := (int(t.In(c.loc).Weekday()) - int(c.spec.FirstWeekday) + 7) % 7
		return c.midnight(y, m, d-back)
	case Month:
		if anchor := c.anchor(y, m); !t.Before(anchor) {
			return anchor
		}
		return c.anchor(y, m-1)
	default:
		return c.midnight(y, m, d)
	}
}

// next is the start of the period after the one starting at start.
func (c *Calendar) next(start time.Time) time.Time {
	y, m, d := start.In(c.loc).Date()
	switch c.spec.Unit {
	case Week:
		d += 7
	case Month:
		return c.anchor(y, m+1)
	default:
		d++
	}
	return c.midnight(y, m, d)
}

// anchor is the start of month m's period: its billing day, or its last day when it has fewer.
func (c *Calendar) anchor(y int, m time.Month) time.Time {
	first := time.Date(y, m, 1, 0, 0, 0, 0, time.UTC) // normalizes m outside 1..12
	y, m = first.Year(), first.Month()
	return c.midnight(y, m, min(c.billingDay(), daysIn(y, m)))
}

// midnight is the first instant of the day (normalized like time.Date): its midnight, or, where
// a DST change skips midnight (America/Santiago in September), the change itself. time.Date
// normalizes a skipped midnight into the day before, which would make that day a period of its
// own an hour long and the next period start where the last one did.
func (c *Calendar) midnight(y int, m time.Month, d int) time.Time {
	t := time.Date(y, m, d, 0, 0, 0, 0, c.loc)
	day := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	if ly, lm, ld := t.In(c.loc).Date(); ly != day.Year() || lm != day.Month() || ld != day.Day() {
		_, change := t.ZoneBounds()
		return change
	}
	return t
}

func (c *Calendar) billingDay() int { return max(c.spec.BillingDay, 1) }

// daysIn is the number of days of month m of year y.
func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}
