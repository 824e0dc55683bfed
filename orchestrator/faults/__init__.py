"""The fault book of each run and carrying faults out (backends know no fault kind)."""
