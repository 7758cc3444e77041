// Package sqltime scans MySQL/MariaDB DATETIME columns into UTC times
// whatever the caller's DSN says: with parseTime=true the driver hands over
// a time.Time, without it the text form. rmqtx stores every timestamp in
// UTC, so both read back as the same instant, and the library never forces
// a DSN setting on its users.
package sqltime

import (
	"database/sql/driver"
	"fmt"
	"time"
)

// layouts accepted for the text form (DATETIME with 0 to 6 fractional digits).
const layout = "2006-01-02 15:04:05.999999999"

// NullTime is a nullable UTC DATETIME.
type NullTime struct {
	Time  time.Time
	Valid bool
}

// Scan implements sql.Scanner.
func (n *NullTime) Scan(v any) error {
	switch x := v.(type) {
	case nil:
		*n = NullTime{}
		return nil
	case time.Time:
		*n = NullTime{Time: x.UTC(), Valid: true}
		return nil
	case []byte:
		return n.parse(string(x))
	case string:
		return n.parse(x)
	default:
		return fmt.Errorf("sqltime: cannot scan %T into a time", v)
	}
}

func (n *NullTime) parse(s string) error {
	if s == "" || s == "0000-00-00 00:00:00" || (len(s) > 19 && s[:19] == "0000-00-00 00:00:00") {
		*n = NullTime{}
		return nil
	}
	t, err := time.ParseInLocation(layout, s, time.UTC)
	if err != nil {
		return fmt.Errorf("sqltime: %w", err)
	}
	*n = NullTime{Time: t, Valid: true}
	return nil
}

// Value implements driver.Valuer, so the type can also be written.
func (n NullTime) Value() (driver.Value, error) {
	if !n.Valid {
		return nil, nil
	}
	return n.Time.UTC(), nil
}

// Ptr returns the time or nil.
func (n NullTime) Ptr() *time.Time {
	if !n.Valid {
		return nil
	}
	t := n.Time
	return &t
}

// Time is a non-null UTC DATETIME; NULL scans as the zero time.
type Time struct{ time.Time }

// Scan implements sql.Scanner.
func (t *Time) Scan(v any) error {
	var n NullTime
	if err := n.Scan(v); err != nil {
		return err
	}
	t.Time = n.Time
	return nil
}

// Value implements driver.Valuer.
func (t Time) Value() (driver.Value, error) { return t.Time.UTC(), nil }
