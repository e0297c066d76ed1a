package grammar

// AnyOf is a text that one of several validators takes: they read it side
// by side, each byte kept by those that take it (a forced call of any of
// several tools whose call formats differ before the arguments: DeepSeek's
// and gpt-oss's put the name in fixed text). Validators are dropped, never
// copied: Accept asks them without changing them.
type AnyOf struct {
	alive []Validator
}

var (
	_ Validator = (*AnyOf)(nil)
	_ Prefixer  = (*AnyOf)(nil)
	_ Classer   = (*AnyOf)(nil)
)

// NewAnyOf returns a validator of a text that one of vs takes (fresh
// validators, owned by it from now on).
func NewAnyOf(vs ...Validator) *AnyOf { return &AnyOf{alive: vs} }

// Accept reports whether b may come next for one of the validators.
func (a *AnyOf) Accept(b []byte) bool {
	for _, v := range a.alive {
		if v.Accept(b) {
			return true
		}
	}
	return false
}

// AcceptLen is the longest prefix of b one of the validators takes
// (Prefixer; a validator that is not one counts all of b, or all but its
// last byte when it refuses b).
func (a *AnyOf) AcceptLen(b []byte) int {
	best := 0
	for _, v := range a.alive {
		var n int
		switch {
		case isPrefixer(v):
			n = v.(Prefixer).AcceptLen(b)
		case v.Accept(b):
			n = len(b)
		default:
			n = len(b) - 1 // refused somewhere: at worst at its last byte
		}
		best = max(best, n)
		if best == len(b) {
			break
		}
	}
	return best
}

func isPrefixer(v Validator) bool { _, ok := v.(Prefixer); return ok }

// Advance appends b for the validators that take it, dropping the others,
// and reports whether any did.
func (a *AnyOf) Advance(b []byte) bool {
	var keep []Validator
	for _, v := range a.alive {
		if v.Accept(b) {
			v.Advance(b)
			keep = append(keep, v)
		}
	}
	if keep == nil {
		return false
	}
	a.alive = keep
	return true
}

// Complete reports whether one of the validators is complete.
func (a *AnyOf) Complete() bool {
	for _, v := range a.alive {
		if v.Complete() {
			return true
		}
	}
	return false
}

// TokenClass is StringBody when every validator still reading is in it.
func (a *AnyOf) TokenClass() TokenClass {
	for _, v := range a.alive {
		if c, ok := v.(Classer); !ok || c.TokenClass() != StringBody {
			return NoClass
		}
	}
	return StringBody
}
