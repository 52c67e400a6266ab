"""Training a draft head for the user's target on their own machine (`specchat train-drafter`)."""
