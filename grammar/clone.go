package grammar

// Clone is an independent copy of v, at the same place in its text, for
// the validators that can be copied (all of this package's); false for
// others. A GrammarText's copy shares its parse-state cache, as every
// validator of its Grammar does (under the cache's lock).
func Clone(v Validator) (Validator, bool) {
	switch v := v.(type) {
	case *JSON:
		return v.Clone(), true
	case *SchemaJSON:
		return v.Clone(), true
	case *Wrapped:
		c := *v
		c.inner = v.inner.Clone()
		return &c, true
	case *RegexText:
		c := *v
		return &c, true
	case *Choice:
		return v.Clone(), true
	case *GrammarText:
		c := *v
		return &c, true
	case *AnyOf:
		c := &AnyOf{alive: make([]Validator, len(v.alive))}
		for i, x := range v.alive {
			var ok bool
			if c.alive[i], ok = Clone(x); !ok {
				return nil, false
			}
		}
		return c, true
	}
	return nil, false
}
