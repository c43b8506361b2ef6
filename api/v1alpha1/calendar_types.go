package v1alpha1

import "time"

// Bounds of a Limit. The markers below repeat them as literals, which markers need; the
// controller checks them again for objects stored before a bound existed.
const (
	// MaxRequests bounds requests and burst.
	MaxRequests = 1_000_000_000
	// MaxSlidingWindowLogRequests bounds requests of SlidingWindowLog, which stores one entry
	// per request in the window in Redis: about 130 bytes each, so a full log of one key is
	// about 1.3 MB.
	MaxSlidingWindowLogRequests = 10_000
	// MinWindow and MaxWindow bound window; MaxRollingWindow bounds it for
	// SlidingWindowCounter, whose windows roll.
	MinWindow        = time.Second
	MaxWindow        = 24 * time.Hour
	MaxRollingWindow = 31 * 24 * time.Hour
)

// CalendarUnit is the length of a calendar period.
// +kubebuilder:validation:Enum=Day;Week;Month
type CalendarUnit string

// The calendar units.
const (
	// CalendarDay is a day from midnight to midnight in the zone: 23 or 25 hours on a DST change.
	CalendarDay CalendarUnit = "Day"
	// CalendarWeek is seven days from midnight of firstWeekday.
	CalendarWeek CalendarUnit = "Week"
	// CalendarMonth is a month from midnight of billingDay: 28 to 31 days.
	CalendarMonth CalendarUnit = "Month"
)

// Weekday names a day of the week.
// +kubebuilder:validation:Enum=Monday;Tuesday;Wednesday;Thursday;Friday;Saturday;Sunday
type Weekday string

// CalendarWindow is a period of a calendar: requests per day, week or month in a time zone.
// +kubebuilder:validation:XValidation:rule="!has(self.firstWeekday) || self.unit == 'Week'",message="calendar.firstWeekday is only for unit: Week"
// +kubebuilder:validation:XValidation:rule="!has(self.billingDay) || self.unit == 'Month'",message="calendar.billingDay is only for unit: Month"
type CalendarWindow struct {
	// unit is the period: Day, Week or Month.
	// +required
	Unit CalendarUnit `json:"unit"`

	// timeZone is the IANA name of the zone whose calendar the periods follow, such as
	// Europe/Berlin or America/New_York; UTC when not set. The zone data is the one Redline's
	// binaries embed; an unknown name sets the policy's Ready condition to False.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$`
	// +optional
	TimeZone string `json:"timeZone,omitempty"`

	// firstWeekday is the day a Week starts on, at midnight; Monday when not set.
	// +optional
	FirstWeekday Weekday `json:"firstWeekday,omitempty"`

	// billingDay is the day of the month a Month starts on, at midnight, from 1 (when not set)
	// to 31. A month with fewer days starts its period on its last day: with 31, periods start
	// on Jan 31, Feb 28 (29 in a leap year), Mar 31, Apr 30.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=31
	// +optional
	BillingDay int32 `json:"billingDay,omitempty"`
}
