"""Running a training job from the controller: presets, the one command builder, launch, follow, status, stop."""
