package chat

import (
	"fmt"
	"strings"
	"time"
)

// strftime formats t like Python's datetime.strftime in the C locale, for
// the directives chat templates use (including glibc's %-d style
// no-padding flag). Unknown directives are copied through as glibc does.
func strftime(t time.Time, format string) string {
	var sb strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 >= len(format) {
			sb.WriteByte(c)
			continue
		}
		i++
		noPad := false
		if format[i] == '-' && i+1 < len(format) {
			noPad = true
			i++
		}
		num := func(v, width int) {
			if noPad {
				fmt.Fprintf(&sb, "%d", v)
			} else {
				fmt.Fprintf(&sb, "%0*d", width, v)
			}
		}
		switch format[i] {
		case 'Y':
			fmt.Fprintf(&sb, "%d", t.Year())
		case 'y':
			num(t.Year()%100, 2)
		case 'm':
			num(int(t.Month()), 2)
		case 'd':
			num(t.Day(), 2)
		case 'e':
			if noPad {
				fmt.Fprintf(&sb, "%d", t.Day())
			} else {
				fmt.Fprintf(&sb, "%2d", t.Day())
			}
		case 'j':
			num(t.YearDay(), 3)
		case 'H':
			num(t.Hour(), 2)
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			num(h, 2)
		case 'M':
			num(t.Minute(), 2)
		case 'S':
			num(t.Second(), 2)
		case 'f':
			fmt.Fprintf(&sb, "%06d", t.Nanosecond()/1000)
		case 'p':
			if t.Hour() < 12 {
				sb.WriteString("AM")
			} else {
				sb.WriteString("PM")
			}
		case 'B':
			sb.WriteString(t.Month().String())
		case 'b', 'h':
			sb.WriteString(t.Month().String()[:3])
		case 'A':
			sb.WriteString(t.Weekday().String())
		case 'a':
			sb.WriteString(t.Weekday().String()[:3])
		case 'w':
			fmt.Fprintf(&sb, "%d", int(t.Weekday()))
		case 'u':
			w := int(t.Weekday())
			if w == 0 {
				w = 7
			}
			fmt.Fprintf(&sb, "%d", w)
		case 'Z':
			name, _ := t.Zone()
			sb.WriteString(name)
		case 'z':
			_, off := t.Zone()
			sign := '+'
			if off < 0 {
				sign, off = '-', -off
			}
			fmt.Fprintf(&sb, "%c%02d%02d", sign, off/3600, off%3600/60)
		case 'F':
			fmt.Fprintf(&sb, "%d-%02d-%02d", t.Year(), int(t.Month()), t.Day())
		case 'T':
			fmt.Fprintf(&sb, "%02d:%02d:%02d", t.Hour(), t.Minute(), t.Second())
		case '%':
			sb.WriteByte('%')
		default:
			sb.WriteByte('%')
			if noPad {
				sb.WriteByte('-')
			}
			sb.WriteByte(format[i])
		}
	}
	return sb.String()
}
