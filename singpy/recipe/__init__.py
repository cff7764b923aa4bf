"""Building images from definition files (singpy build OUT RECIPE.def).

One module per concern: `workdir` (where a build works, and removing it),
`bootstrap` (the base root filesystem of a stage), `files` (%files copies),
`sections` (%setup on the host, %post and %test in the container),
`metadata` (/.singularity.d written from the definition), `mapped` (host
programs run as root of the build's user namespace), `engine` (the stages
in Apptainer's order, then the output).
"""
